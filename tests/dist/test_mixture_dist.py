"""A mixed-task run on 2 processes resumed on 1: the mixture's sequence and the weights are
those of one plain-PyTorch process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tandem
from tests.dist import mix_task
from tests.dist.procs import run_ranks

GLOBAL = 20
LEGS = [(2, 9), (1, 16)]  # (world size, train.steps at the leg's end); an epoch is 7 steps


def _leg(rank: int, world: int, out: str, steps: int) -> None:
    mix_task.SEEN.clear()
    result = tandem.fit(mix_task.task(), config=mix_task.config(out, steps, GLOBAL))
    Path(out, f"seen-{world}-{rank}.json").write_text(json.dumps(mix_task.SEEN))
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


@pytest.mark.timeout(150)
def test_a_mixture_resumed_at_another_world_size_continues_its_sequence(
        tmp_path: Path) -> None:
    trained: list[list[tuple[str, int]]] = []
    start = 0
    for world, steps in LEGS:
        if world == 1:  # one process: this one (no process group)
            _leg(0, 1, str(tmp_path), steps)
        else:
            run_ranks(_leg, world, str(tmp_path), steps, timeout=110)
        seen = [[tuple(s) for s in json.loads((tmp_path / f"seen-{world}-{r}.json")
                                              .read_text())] for r in range(world)]
        share = GLOBAL // world
        for step in range(steps - start):
            # Within a micro-batch the samples are grouped by source: compare each step's.
            trained.append(sorted(s for r in range(world)
                                  for s in seen[r][step * share:(step + 1) * share]))
        start = steps
    assert trained == [sorted(b) for b in mix_task.stream(5, LEGS[-1][1], GLOBAL)]
    ref, _ = mix_task.reference(5, LEGS[-1][1], GLOBAL)
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
