"""A run checkpointed at 4 processes resumes at 2, 1 and 4 again: same samples, same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks

GLOBAL = 40
LEGS = [(4, 8), (2, 14), (1, 17), (4, 20)]  # (world size, train.steps at the leg's end)


def _leg(rank: int, world: int, out: str, steps: int, tag: str) -> None:
    cfg = toy_task.config(out, steps, GLOBAL, checkpoint={"every": 4})
    result = tandem.fit(toy_task.task(), config=cfg)
    Path(out, f"seen-{tag}-{rank}.json").write_text(json.dumps(toy_task.SEEN))
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


@pytest.mark.timeout(180)
def test_resume_across_world_sizes_repeats_and_skips_nothing(tmp_path: Path) -> None:
    trained: list[int] = []
    start = 0
    for world, steps in LEGS:
        run_ranks(_leg, world, str(tmp_path), steps, f"{world}", timeout=100)
        seen = [json.loads((tmp_path / f"seen-{world}-{r}.json").read_text())
                for r in range(world)]
        trained += toy_task.global_order(seen, GLOBAL, steps - start)
        start = steps
    _, order = toy_task.reference(LEGS[-1][1], GLOBAL)
    assert trained == order
    ref, _ = toy_task.reference(LEGS[-1][1], GLOBAL)
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    assert summary["steps"] == LEGS[-1][1] and summary["world_size"] == LEGS[-1][0]
