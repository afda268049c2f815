"""N processes x K accumulation steps train exactly what one plain PyTorch process trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL = 20, 40


def _train(rank: int, world: int, out: str, micro: int, steps: int, extra: dict) -> None:
    cfg = toy_task.config(out, steps, GLOBAL, micro, **extra)
    result = tandem.fit(toy_task.task(), config=cfg)
    Path(out, f"seen{rank}.json").write_text(json.dumps(toy_task.SEEN))
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


def _assert_matches_reference(out: Path, clip: float = 0.0) -> None:
    ref, _ = toy_task.reference(STEPS, GLOBAL, clip=clip)
    got = torch.load(out / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world", "micro"), [(1, 0), (1, 8), (2, 0), (2, 4), (4, 0), (4, 5)])
def test_weights_match_plain_pytorch(tmp_path: Path, world: int, micro: int) -> None:
    # Calibration's extra passes (exposed communication, FLOPs) must not alter training.
    extra = {"checkpoint": {"at_end": False}, "monitor": {"calibrate_at": 5}}
    run_ranks(_train, world, str(tmp_path), micro, STEPS, extra, timeout=100)
    _assert_matches_reference(tmp_path)


@pytest.mark.timeout(120)
def test_clipping_uses_the_global_norm_of_the_accumulated_gradient(tmp_path: Path) -> None:
    extra = {"checkpoint": {"at_end": False}, "train": {"grad_clip": 0.05}}
    run_ranks(_train, 2, str(tmp_path), 5, STEPS, extra, timeout=100)
    _assert_matches_reference(tmp_path, clip=0.05)


@pytest.mark.timeout(120)
def test_ranks_take_disjoint_slices_of_the_global_order(tmp_path: Path) -> None:
    extra = {"checkpoint": {"at_end": False}}
    run_ranks(_train, 2, str(tmp_path), 0, STEPS, extra, timeout=100)
    seen = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in range(2)]
    _, order = toy_task.reference(STEPS, GLOBAL)
    share = GLOBAL // 2
    for step in range(STEPS):
        batch = order[step * GLOBAL:(step + 1) * GLOBAL]
        assert seen[0][step * share:(step + 1) * share] == batch[:share]
        assert seen[1][step * share:(step + 1) * share] == batch[share:]
