"""Strategies chosen by config, through tandem.fit: same script, same math (or bounded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks

GLOBAL = 40


def _train(rank: int, world: int, out: str, micro: int, steps: int, extra: dict) -> None:
    cfg = toy_task.config(out, steps, GLOBAL, micro, **extra)
    result = tandem.fit(toy_task.task(), config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


def _check(out: Path, steps: int, clip: float = 0.0, rtol: float = 1e-5,
           atol: float = 1e-6) -> None:
    ref, _ = toy_task.reference(steps, GLOBAL, clip=clip)
    got = torch.load(out / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=rtol, atol=atol, msg=name)


@pytest.mark.timeout(150)
def test_fsdp_with_accumulation_and_clipping_matches_plain_pytorch(tmp_path: Path) -> None:
    extra = {"plan": {"strategy": "fsdp"}, "train": {"grad_clip": 0.05},
             "checkpoint": {"at_end": False}}
    run_ranks(_train, 2, str(tmp_path), 5, 20, extra, timeout=140)
    _check(tmp_path, 20, clip=0.05)


@pytest.mark.timeout(200)
def test_checkpoints_move_between_fsdp_and_ddp(tmp_path: Path) -> None:
    for strategy, steps in (("fsdp", 8), ("ddp", 14), ("fsdp", 20)):
        extra = {"plan": {"strategy": strategy}, "checkpoint": {"every": 0, "at_end": True}}
        run_ranks(_train, 2, str(tmp_path), 0, steps, extra, timeout=140)
    _check(tmp_path, 20)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("hook", ["fp16", "powersgd"])
def test_comm_hooks_through_fit_report_their_bytes(tmp_path: Path, hook: str) -> None:
    extra = {"plan": {"comm_hook": hook, "powersgd_warmup": 2},
             "checkpoint": {"at_end": False}, "monitor": {"log_every": 5}}
    run_ranks(_train, 2, str(tmp_path), 0, 20, extra, timeout=140)
    if hook == "fp16":
        _check(tmp_path, 20, rtol=3e-3, atol=3e-4)
    with RunStore(tmp_path / "tandem.db") as store:
        run_id = store.runs()[-1]["run_id"]
        sent = [m["value"] for m in store.metrics(run_id, name="comm/bytes_per_step")]
    fp32 = sum(p.numel() * 4 for p in toy_task.make_model().parameters())  # 2(N-1)/N = 1
    assert sent and sent[-1] < 0.6 * fp32
