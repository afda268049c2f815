"""A batch-size ramp trains what a plain loop with the same growing batches trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tandem
from tandem.data.sampler import epoch_order
from tandem.runtime import derive_seed
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL, MICRO, SEED = 8, 40, 10, 7
RAMP = "0:20,3:40"  # 20 samples (accumulation 1 at 2 ranks) for 3 steps, then 40
LR = 0.05


def batch_at(step: int) -> int:
    return 20 if step < 3 else 40


def _train(rank: int, world: int, out: str) -> None:
    cfg = toy_task.config(out, STEPS, GLOBAL, MICRO, SEED,
                          train={"batch_ramp": RAMP},
                          optim={"lr_scaling": "linear", "reference_batch": GLOBAL})
    result = tandem.fit(toy_task.task(), config=cfg)
    Path(out, f"seen{rank}.json").write_text(json.dumps(toy_task.SEEN))
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))
        Path(out, "summary.json").write_text(json.dumps(result.summary, default=str))


def reference() -> tuple[dict[str, torch.Tensor], list[int]]:
    """Plain PyTorch: step s takes the next batch_at(s) samples; lr scaled by batch / 40."""
    torch.manual_seed(derive_seed("build", SEED))
    data, model = toy_task.IndexedData(), toy_task.make_model()
    opt = toy_task.make_optimizer(model.parameters())
    epoch, offset, seen = 0, 0, []
    for step in range(STEPS):
        size = batch_at(step)
        if offset + size > toy_task.N_SAMPLES:
            epoch, offset = epoch + 1, 0
        ids = epoch_order(SEED, epoch, toy_task.N_SAMPLES)[offset:offset + size]
        offset += size
        seen += ids.tolist()
        for group in opt.param_groups:
            group["lr"] = LR * size / GLOBAL
        opt.zero_grad()
        nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
        opt.step()
    return model.state_dict(), seen


@pytest.mark.timeout(120)
def test_ramp_on_two_processes_matches_the_plain_loop(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), timeout=100)
    want, order = reference()
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
    seen = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in range(2)]
    assert sorted(seen[0] + seen[1]) == sorted(order)
    assert len(seen[0]) == 3 * 10 + 5 * 20  # micro-batches of 10: 1 per step, then 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == STEPS
