"""The gradient-noise probe sees each rank's own gradient before DDP's all-reduce."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tandem
from tandem.data.sampler import epoch_order
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL, WORLD, SEED = 8, 40, 2, 7


def _train(rank: int, world: int, out: str) -> None:
    cfg = toy_task.config(out, STEPS, GLOBAL, micro_batch=10, seed=SEED,
                          monitor={"log_every": 4}, checkpoint={"at_end": False})
    tandem.fit(toy_task.task(), config=cfg)


def _norms_at(step: int) -> tuple[float, float]:
    """Plain PyTorch: (mean over ranks of |g_rank|^2, |g|^2) at 0-based step `step`."""
    model, _ = toy_task.reference(step, GLOBAL, seed=SEED)
    data = toy_task.IndexedData()
    offset = step * GLOBAL % toy_task.N_SAMPLES
    epoch = step * GLOBAL // toy_task.N_SAMPLES
    ids = epoch_order(SEED, epoch, toy_task.N_SAMPLES)[offset:offset + GLOBAL]

    def grad_sq(part: torch.Tensor) -> float:
        model.zero_grad()
        nn.functional.mse_loss(model(data.x[part]), data.y[part]).backward()
        return sum(float(p.grad.pow(2).sum()) for p in model.parameters())

    per_rank = GLOBAL // WORLD
    small = [grad_sq(ids[r * per_rank:(r + 1) * per_rank]) for r in range(WORLD)]
    return sum(small) / WORLD, grad_sq(ids)


@pytest.mark.timeout(120)
def test_small_and_big_gradient_norms_match_plain_pytorch(tmp_path: Path) -> None:
    run_ranks(_train, WORLD, str(tmp_path), timeout=100)
    with RunStore(tmp_path / "tandem.db") as store:
        rid = store.runs()[-1]["run_id"]
        small = {m["step"]: m["value"] for m in store.metrics(rid, name="gns/small_grad_sq")}
        big = {m["step"]: m["value"] for m in store.metrics(rid, name="gns/big_grad_sq")}
        noise = store.metrics(rid, name="grad_noise_scale")
    assert sorted(small) == [4, 8]  # the last step of each window is measured
    for window_end in (4, 8):
        want_small, want_big = _norms_at(window_end - 1)
        assert small[window_end] == pytest.approx(want_small, rel=1e-4)
        assert big[window_end] == pytest.approx(want_big, rel=1e-4)
    # B_noise from the two windows, smoothed as documented (weight 0.2 on the newest).
    b_small, b_big = GLOBAL // WORLD, GLOBAL
    g2 = tr = None
    for window_end in (4, 8):
        s, b = small[window_end], big[window_end]
        g2_now = (b_big * b - b_small * s) / (b_big - b_small)
        tr_now = (s - b) / (1 / b_small - 1 / b_big)
        g2 = g2_now if g2 is None else 0.8 * g2 + 0.2 * g2_now
        tr = tr_now if tr is None else 0.8 * tr + 0.2 * tr_now
    recorded = {m["step"]: m["value"] for m in noise}
    if g2 > 0 and tr >= 0:
        assert recorded[8] == pytest.approx(tr / g2, rel=1e-9)
    else:
        assert 8 not in recorded
