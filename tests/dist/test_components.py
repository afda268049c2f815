"""Components defined only in a test (a freeze by name, a stateful loss term) at two
processes under DDP with accumulation: the plain PyTorch result, and a resume that is
bit-exact against the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.unit.test_components import Freeze, WeightPenalty, reference

GLOBAL, STEPS = 20, 8


def _leg(rank: int, world: int, out: str, steps: int) -> None:
    cfg = toy_task.config(out, steps, GLOBAL, micro_batch=5, checkpoint={"at_end": True},
                          plan={"strategy": "ddp"})
    term = WeightPenalty()
    result = tandem.fit(toy_task.task(), config=cfg, components=[Freeze("0.*"), term])
    assert term.steps == steps  # restored on resume, then counted on
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, f"weights-{steps}.pt"))


@pytest.mark.timeout(900)
def test_components_at_two_processes_resume_bit_exact(tmp_path: Path) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    run_ranks(_leg, 2, str(whole), STEPS, timeout=240)
    run_ranks(_leg, 2, str(parts), STEPS // 2, timeout=240)
    run_ranks(_leg, 2, str(parts), STEPS, timeout=240)
    uninterrupted = torch.load(whole / f"weights-{STEPS}.pt", weights_only=True)
    resumed = torch.load(parts / f"weights-{STEPS}.pt", weights_only=True)
    for name, value in uninterrupted.items():
        assert torch.equal(value, resumed[name]), name
    for name, value in reference(STEPS, GLOBAL).state_dict().items():
        torch.testing.assert_close(uninterrupted[name], value, rtol=1e-5, atol=1e-6, msg=name)
