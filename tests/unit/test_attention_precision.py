"""Attention in fp32 inside bf16 autocast: the same attention as a float64 computation by
hand, run by fp32 kernels forward and backward, and nothing else changed."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tandem.config import PrecisionConfig
from tandem.trainer.attention import resolve
from tandem.trainer.precision import Precision

CPU = torch.device("cpu")


def _precision(mode: str = "bf16", attention: str = "auto") -> Precision:
    return Precision(PrecisionConfig(mode=mode, attention=attention), CPU)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               causal: bool, scale: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in float64, written out."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        t = q.shape[-2]
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        scores = scores + mask.double() if mask.is_floating_point() else \
            scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def _qkv(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 16, 8, generator=g).bfloat16().requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("case", ["causal", "float_mask_and_scale", "bool_mask"])
def test_fp32_attention_forward_and_backward_match_float64(case: str) -> None:
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(1)
    mask = {"causal": None, "float_mask_and_scale": torch.randn(16, 16, generator=g),
            "bool_mask": torch.rand(16, 16, generator=g) > 0.3}[case]
    if mask is not None and mask.dtype == torch.bool:
        mask[:, 0] = True  # every query sees at least one key
    scale = 0.2 if case == "float_mask_and_scale" else None
    causal = case == "causal"
    weights = torch.randn(2, 3, 16, 8, generator=g)
    with _precision().autocast():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             scale=scale)
    assert out.dtype == torch.bfloat16  # what autocast itself returns
    (out.float() * weights).sum().backward()

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _reference(q64, k64, v64, mask, causal, scale)
    (ref * weights.double()).sum().backward()
    ulp = 2.0 ** -8  # bf16 keeps 8 significant bits: the final rounding, nothing more
    assert torch.allclose(out.double(), ref, rtol=ulp, atol=ulp * ref.abs().max().item())
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert got is not None and want is not None and got.dtype == torch.bfloat16
        assert torch.allclose(got.double(), want, rtol=ulp, atol=ulp * want.abs().max().item())


class _AttentionDtypes(TorchDispatchMode):
    """The dtype of the query at every aten attention kernel, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "scaled_dot_product" in func.__name__ or "attention" in func.__name__:
            self.seen.append((func.__name__, args[0].dtype))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("attention", "kernel_dtype"),
                         [("fp32", torch.float32), ("auto", torch.float32),
                          ("autocast", torch.bfloat16)])
def test_the_kernels_run_in_the_chosen_dtype(attention: str, kernel_dtype: torch.dtype) -> None:
    q, k, v = _qkv()
    with _AttentionDtypes() as log:
        with _precision(attention=attention).autocast():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().sum().backward()
    names = {name for name, _ in log.seen}
    assert any("backward" in n for n in names) and any("backward" not in n for n in names)
    assert {dtype for _, dtype in log.seen} == {kernel_dtype}


def test_attention_outside_autocast_is_untouched() -> None:
    q, k, v = (t.detach().float() for t in _qkv())
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with _precision(mode="fp32").autocast():
        same = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with _precision().autocast(), torch.autocast("cpu", enabled=False):
        also = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(plain, same) and torch.equal(plain, also)
    assert _precision(mode="fp32").attention == "fp32"  # nothing to change: no autocast


class _Attends(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes = [type(m).__name__ for m in _function_modes()]
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


class _Linear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes = [type(m).__name__ for m in _function_modes()]
        return super().forward(x)


def _function_modes() -> list:
    from torch.overrides import _get_current_function_mode_stack

    return _get_current_function_mode_stack()


def test_the_mode_stays_only_for_models_that_attend() -> None:
    """The first forward tells: a model that attends keeps fp32 attention on every later
    forward; one that does not leaves the mode (and its cost per op) out from then on."""
    q = _qkv()[0].detach()
    attends, precision = _Attends(), _precision()
    for _ in range(3):
        with _AttentionDtypes() as log, precision.autocast():
            attends(q)
        assert "FullPrecisionAttention" in attends.modes
        assert {dtype for _, dtype in log.seen} == {torch.float32}
    assert precision.attends is True
    linear, precision = _Linear(8, 8), _precision()
    with precision.autocast():
        linear(torch.randn(2, 8))
    assert "FullPrecisionAttention" in linear.modes and precision.attends is False
    with precision.autocast():
        assert linear(torch.randn(2, 8)).dtype == torch.bfloat16  # autocast still on
    assert "FullPrecisionAttention" not in linear.modes


def test_other_operations_keep_autocast() -> None:
    x = torch.randn(4, 8)
    layer = torch.nn.Linear(8, 8)
    with _precision().autocast():
        assert layer(x).dtype == torch.bfloat16


def test_auto_is_fp32_on_cpu_and_autocast_on_gpus() -> None:
    assert resolve("auto", CPU) == "fp32"
    assert resolve("auto", torch.device("cuda", 0)) == "autocast"
    assert resolve("autocast", CPU) == "autocast"
    assert resolve("fp32", torch.device("cuda", 0)) == "fp32"
