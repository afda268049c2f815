"""LARS and LAMB follow their papers' formulas, checked against scalar reference loops."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from tandem.optim.lamb import LAMB
from tandem.optim.lars import LARS

SHAPES = [(4, 3), (5,), (3, 2, 2), (2, 3)]
STEPS = 6


def _problem(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial weights (the last one all zeros) and one gradient per step per parameter."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(shape) for shape in SHAPES]
    weights[-1] = np.zeros(SHAPES[-1])  # exercises the zero-norm branch of the trust ratio
    grads = [[rng.standard_normal(shape) for shape in SHAPES] for _ in range(STEPS)]
    grads[2][1] = np.zeros(SHAPES[1])  # a zero gradient, once
    return weights, grads


def _norm(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values))


def _lars_reference(weights: list[np.ndarray], grads: list[list[np.ndarray]], lr: float,
                    momentum: float, wd: float, trust: float, eps: float,
                    exclude: bool) -> list[np.ndarray]:
    """You et al. 2017, Algorithm 1, one scalar at a time."""
    w = [list(x.ravel().astype(float)) for x in weights]
    v = [[0.0] * len(x) for x in w]
    for step_grads in grads:
        for i, g_arr in enumerate(step_grads):
            g = list(g_arr.ravel().astype(float))
            adapt = not (exclude and len(SHAPES[i]) <= 1)
            if adapt:
                w_norm, g_norm = _norm(w[i]), _norm(g)
                local = trust * w_norm / (g_norm + wd * w_norm + eps)
                if w_norm == 0 or g_norm == 0:
                    local = 1.0
                decay = wd
            else:
                local, decay = 1.0, 0.0
            for j in range(len(g)):
                v[i][j] = momentum * v[i][j] + lr * local * (g[j] + decay * w[i][j])
                w[i][j] -= v[i][j]
    return [np.array(x).reshape(shape) for x, shape in zip(w, SHAPES, strict=True)]


def _lamb_reference(weights: list[np.ndarray], grads: list[list[np.ndarray]], lr: float,
                    beta1: float, beta2: float, eps: float, wd: float) -> list[np.ndarray]:
    """You et al. 2019 (LAMB with Adam's bias correction), one scalar at a time."""
    w = [list(x.ravel().astype(float)) for x in weights]
    m = [[0.0] * len(x) for x in w]
    v = [[0.0] * len(x) for x in w]
    for t, step_grads in enumerate(grads, start=1):
        for i, g_arr in enumerate(step_grads):
            g = list(g_arr.ravel().astype(float))
            r = []
            for j in range(len(g)):
                m[i][j] = beta1 * m[i][j] + (1 - beta1) * g[j]
                v[i][j] = beta2 * v[i][j] + (1 - beta2) * g[j] * g[j]
                m_hat = m[i][j] / (1 - beta1**t)
                v_hat = v[i][j] / (1 - beta2**t)
                r.append(m_hat / (math.sqrt(v_hat) + eps) + wd * w[i][j])
            w_norm, r_norm = _norm(w[i]), _norm(r)
            ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            for j in range(len(g)):
                w[i][j] -= lr * ratio * r[j]
    return [np.array(x).reshape(shape) for x, shape in zip(w, SHAPES, strict=True)]


def _run(make: type, kwargs: dict, weights: list[np.ndarray],
         grads: list[list[np.ndarray]]) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in weights]
    opt = make(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("exclude", [True, False])
@pytest.mark.parametrize(("momentum", "wd"), [(0.9, 0.0), (0.9, 1e-2), (0.0, 5e-3)])
def test_lars_matches_the_formula(exclude: bool, momentum: float, wd: float) -> None:
    weights, grads = _problem()
    kwargs = {"lr": 0.5, "momentum": momentum, "weight_decay": wd,
              "trust_coefficient": 0.02, "eps": 1e-8, "exclude_bias_and_norm": exclude}
    got = _run(LARS, kwargs, weights, grads)
    want = _lars_reference(weights, grads, 0.5, momentum, wd, 0.02, 1e-8, exclude)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-12)
    assert not np.allclose(got[0].numpy(), weights[0])  # something happened


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_the_formula(wd: float) -> None:
    weights, grads = _problem(1)
    got = _run(LAMB, {"lr": 0.01, "betas": (0.9, 0.99), "eps": 1e-6, "weight_decay": wd},
               weights, grads)
    want = _lamb_reference(weights, grads, 0.01, 0.9, 0.99, 1e-6, wd)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-12)
    assert not np.allclose(got[-1].numpy(), 0.0)  # the zero layer moved (trust ratio 1)


def test_float32_agrees_with_float64() -> None:
    weights, grads = _problem(2)
    want = _lamb_reference(weights, grads, 0.01, 0.9, 0.999, 1e-6, 0.01)
    params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in weights]
    opt = LAMB(params, lr=0.01, weight_decay=0.01)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    for p, w in zip(params, want, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("make", "kwargs"), [
    (LARS, {"lr": 0.3, "weight_decay": 1e-3, "trust_coefficient": 0.01}),
    (LAMB, {"lr": 0.01, "weight_decay": 1e-2}),
])
def test_state_dict_round_trip_continues_identically(make: type, kwargs: dict) -> None:
    weights, grads = _problem(3)
    params = [torch.nn.Parameter(torch.tensor(w)) for w in weights]
    opt = make(params, **kwargs)

    def step(ps: list[torch.nn.Parameter], o: torch.optim.Optimizer, gs: list) -> None:
        for p, g in zip(ps, gs, strict=True):
            p.grad = torch.tensor(g)
        o.step()

    for gs in grads[:3]:
        step(params, opt, gs)
    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(clones, **kwargs)
    # A deep copy: load_state_dict keeps same-device tensors, so both would share buffers.
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    for gs in grads[3:]:
        step(params, opt, gs)
        step(clones, resumed, gs)
    for a, b in zip(params, clones, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(("make", "kwargs", "field"), [
    (LARS, {"lr": -1.0}, "lr"),
    (LARS, {"lr": 0.1, "momentum": 1.0}, "momentum"),
    (LARS, {"lr": 0.1, "trust_coefficient": 0.0}, "trust_coefficient"),
    (LAMB, {"lr": 0.1, "betas": (0.9, 1.0)}, "betas"),
    (LAMB, {"lr": 0.1, "weight_decay": -0.1}, "weight_decay"),
])
def test_bad_hyper_parameters_are_named(make: type, kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make([torch.nn.Parameter(torch.zeros(2))], **kwargs)
