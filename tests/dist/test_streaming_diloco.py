"""Streaming DiLoCo against an independent computation of its math (one process, plain
PyTorch replicas), DiLoCo itself at P = 1, tau = 0, its outer sums in each format against
the plain sum, and a kill/resume in mid-flight."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import tandem
from tandem.monitor.store import RunStore
from tandem.parallel.outer_sum import OUTER_DTYPES, start_sum
from tests.dist import toy_task
from tests.dist.procs import run_ranks

GLOBAL, H, STEPS, WORLD = 40, 4, 22, 2
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9
PLANS = {"diloco": {"strategy": "diloco"},
         "p1t0": {"strategy": "streaming_diloco", "fragments": 1, "overlap_steps": 0},
         "p2t1": {"strategy": "streaming_diloco", "fragments": 2, "overlap_steps": 1}}


def _sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.05)


def _fit(out: str, tag: str, plan: dict, optimizer=_sgd,  # type: ignore[no-untyped-def]
         **sections: dict) -> None:
    task = tandem.Task(model=toy_task.make_model, optimizer=optimizer,
                       train_data=toy_task.IndexedData, loss=toy_task.loss)
    cfg = toy_task.config(str(Path(out, tag)), STEPS, GLOBAL,
                          plan={"sync_every": H, **plan}, monitor={"log_every": 4},
                          **{"checkpoint": {"every": 0, "at_end": False}, **sections})
    result = tandem.fit(task, config=cfg)
    torch.save(result.model.state_dict(), Path(out, f"{tag}-{dist.get_rank()}.pt"))


def _plans(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")  # one group for the runs one after another
    for tag, plan in PLANS.items():
        _fit(out, tag, plan)
    sums = {}
    for dtype in OUTER_DTYPES:
        summed = start_sum(_outer_grad(rank), SIZES, dtype)
        sums[dtype] = (summed.wait(), torch.tensor(summed.bytes_sent))
    torch.save(sums, Path(out, f"sums-{rank}.pt"))
    dist.destroy_process_group()


SIZES = [30, 5, 65]  # tensors of a fragment: int8 scales each on its own


def _outer_grad(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.cat([torch.randn(n, generator=g) * 10.0 ** -k for k, n in enumerate(SIZES)])


def reference(steps: int, fragments: int, tau: int, alpha: float = 0.5,
              optimizer=_sgd, ddp_steps: int = 0) -> dict:  # type: ignore[no-untyped-def]
    """WORLD replicas of the toy model in one process, on flat parameter vectors: each
    replica trains on its share of every global batch; fragment p (the p-th of P equal
    runs of the vector) meets at the steps s with (s - p*H//P) % H == 0, and its averaged
    pseudo-gradient is applied tau steps later (outer Nesterov SGD), the replica's run
    replaced (tau = 0) or mixed with alpha; after the last step all meet and replace.
    The first `ddp_steps` train one model on the whole global batch (DDP's math)."""
    data, reps, opts, outer, velocity = toy_task.replicas(WORLD, optimizer)
    bounds = [k * outer.numel() // fragments for k in range(fragments + 1)]
    order = toy_task.reference(steps, GLOBAL)[1]
    pending: dict[int, tuple[int, torch.Tensor]] = {}

    def flat(r: int) -> torch.Tensor:
        return parameters_to_vector(reps[r].parameters()).detach().clone()

    def start(p: int, s: int) -> None:
        lo, hi = bounds[p], bounds[p + 1]
        pending[p] = (s + tau, sum(outer[lo:hi] - flat(r)[lo:hi] for r in range(WORLD)) / WORLD)

    def merge(p: int, replace: bool) -> None:
        lo, hi = bounds[p], bounds[p + 1]
        g = pending.pop(p)[1]
        velocity[lo:hi] = OUTER_MOMENTUM * velocity[lo:hi] + g
        outer[lo:hi] -= OUTER_LR * (g + OUTER_MOMENTUM * velocity[lo:hi])
        for r in range(WORLD):
            v = flat(r)
            v[lo:hi] = outer[lo:hi] if replace else alpha * v[lo:hi] + (1 - alpha) * outer[lo:hi]
            with torch.no_grad():
                vector_to_parameters(v, reps[r].parameters())

    for step in range(ddp_steps):
        ids = torch.tensor(order[step * GLOBAL:(step + 1) * GLOBAL])
        opts[0].zero_grad()
        torch.nn.functional.mse_loss(reps[0](data.x[ids]), data.y[ids]).backward()
        opts[0].step()
    for r in range(1, WORLD):
        reps[r].load_state_dict(reps[0].state_dict())
    outer = parameters_to_vector(reps[0].parameters()).detach().clone()
    for step in range(ddp_steps, steps):
        ids = order[step * GLOBAL:(step + 1) * GLOBAL]
        toy_task.inner_steps(data, reps, opts, ids)
        s, replaced = step + 1, set()
        for p in [p for p, (due, _) in pending.items() if due == s]:
            merge(p, replace=False)
        for p in range(fragments):
            if (s - p * H // fragments) % H == 0:
                start(p, s)
                if tau == 0:
                    merge(p, replace=True)
                    replaced.add(p)
    for p in list(pending):
        merge(p, replace=False)
    for p in set(range(fragments)) - replaced:
        start(p, steps)
        merge(p, replace=True)
    return reps[0].state_dict()


def _close(got: dict, want: dict) -> None:
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(180)
def test_streaming_matches_its_math_diloco_and_sums_in_each_format(tmp_path: Path) -> None:
    run_ranks(_plans, WORLD, str(tmp_path), timeout=160)
    w = {tag: [torch.load(tmp_path / f"{tag}-{r}.pt", weights_only=True) for r in range(WORLD)]
         for tag in PLANS}
    for tag in PLANS:  # the last meeting leaves one model
        assert all(torch.equal(w[tag][0][k], w[tag][1][k]) for k in w[tag][0]), tag
    _close(w["p1t0"][0], w["diloco"][0])  # P = 1, tau = 0 is DiLoCo
    _close(w["p1t0"][0], reference(STEPS, 1, 0))
    _close(w["p2t1"][0], reference(STEPS, 2, 1))
    with RunStore(tmp_path / "p2t1" / "tandem.db") as store:
        run_id = store.runs()[-1]["run_id"]
        peak = [m["value"] for m in store.metrics(run_id, name="comm/peak_bytes_per_sync")]
        overlap = [m["value"] for m in store.metrics(run_id, name="comm/overlap")]
    # 2(N-1)/N = 1 of a fragment's fp32 values: the toy model's 515 cut 257 | 258.
    assert max(peak) == 258 * 4
    assert overlap and all(0 <= v <= 1 for v in overlap)
    # The outer gradients' sum in every format, against the sum of both ranks' vectors.
    sums = [torch.load(tmp_path / f"sums-{r}.pt", weights_only=True) for r in range(WORLD)]
    grads = [_outer_grad(r) for r in range(WORLD)]
    want = grads[0] + grads[1]
    scales = [torch.stack([part.abs().max() / 127 for part in torch.split(g, SIZES)])
              for g in grads]
    int8_bound = torch.repeat_interleave(sum(scales) / 2, torch.tensor(SIZES))
    # Half precision: two roundings of each value and one of the sum, relative to the
    # values summed (a sum that cancels keeps their absolute error).
    size = grads[0].abs() + grads[1].abs()
    for dtype, bound in (("fp32", 1e-6 * size), ("fp16", 2.0 ** -10 * size),
                         ("bf16", 2.0 ** -7 * size), ("int8", int8_bound)):
        got = sums[0][dtype][0]
        assert torch.equal(got, sums[1][dtype][0]), dtype  # one sum on every rank
        assert ((got - want).abs() <= bound + 1e-7).all(), dtype
    # Bytes a rank sends: a ring all-reduce 2(N-1)/N of the buffer, an all-gather N-1
    # copies of the int8 values and the 3 scales.
    assert {d: int(sums[0][d][1]) for d in OUTER_DTYPES} == {
        "fp32": 400, "fp16": 200, "bf16": 200, "int8": 100 + 3 * 4}


def _kill_and_resume(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")
    plan, ckpt = PLANS["p2t1"], {"every": 5, "at_end": False, "async_save": False}
    # Killed before step 14 of 22 (60%): the checkpoint of step 10 has fragment 1's sum
    # in flight (it met at step 10 and merges at 11).
    os.environ["TANDEM_FAULTS"] = json.dumps([{"step": 13, "kind": "raise"}])
    with pytest.raises(RuntimeError, match="injected"):
        _fit(out, "run", plan, toy_task.make_optimizer, checkpoint=ckpt)
    first = toy_task.SEEN[:10 * GLOBAL // world]
    del os.environ["TANDEM_FAULTS"]
    toy_task.SEEN.clear()
    _fit(out, "run", plan, toy_task.make_optimizer, checkpoint=ckpt)
    Path(out, f"seen-{rank}.json").write_text(json.dumps(first + toy_task.SEEN))
    # A DDP run's checkpoint resumed as streaming DiLoCo: its outer parameters start from
    # the DDP weights (the checkpoint holds no streaming state).
    _fit(out, "switch", {"strategy": "ddp"}, train={"steps": 8},
         checkpoint={"every": 0, "at_end": True})
    _fit(out, "switch", plan)
    with pytest.raises(tandem.errors.UsageError, match="resume it with the same plan on 2"):
        _fit(out, "run", {**plan, "fragments": 1}, toy_task.make_optimizer)  # 2 parts: refused
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_a_resume_in_mid_flight_loses_no_sample_and_no_fragment_update(tmp_path: Path) -> None:
    run_ranks(_kill_and_resume, WORLD, str(tmp_path), timeout=160)
    share = GLOBAL // WORLD
    seen = [json.loads((tmp_path / f"seen-{r}.json").read_text()) for r in range(WORLD)]
    trained = [i for step in range(STEPS) for r in range(WORLD)
               for i in seen[r][step * share:(step + 1) * share]]
    assert trained == toy_task.reference(STEPS, GLOBAL)[1]
    # Each replica's momentum, its own weights and the sum in flight came back.
    want = reference(STEPS, 2, 1, optimizer=toy_task.make_optimizer)
    for r in range(WORLD):
        _close(torch.load(tmp_path / f"run-{r}.pt", weights_only=True), want)
    _close(torch.load(tmp_path / "switch-0.pt", weights_only=True),
           reference(STEPS, 2, 1, ddp_steps=8))
