"""Bounded-staleness asynchronous training resumed at another world size: a run of 2
workers killed at 2/3 (a worker slowed: pushes in flight, changes not yet pushed) resumes
on 3 (3 -> 2 folds alike: tests/unit/test_async_parts.py); every sample of the run is trained
once over the two halves, and the workers end with one model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.dist.test_async import _sgd

GLOBAL, H, STEPS, EVERY, KILL = 30, 4, 24, 8, 16
SLOW = [{"rank": 1, "step": 0, "until": 10**6, "kind": "slow", "seconds": 0.02}]


def _fit(out: str, tag: str) -> None:
    toy_task.SEEN.clear()
    task = tandem.Task(model=toy_task.make_model, optimizer=_sgd,
                       train_data=toy_task.IndexedData, loss=toy_task.loss)
    cfg = toy_task.config(str(Path(out, tag)), STEPS, GLOBAL, monitor={"log_every": 4},
                          plan={"strategy": "async", "staleness": 2, "sync_every": H},
                          checkpoint={"every": EVERY, "at_end": False, "async_save": False})
    result = tandem.fit(task, config=cfg)
    torch.save(result.model.state_dict(), Path(out, f"{tag}-end-{dist.get_rank()}.pt"))


def _first_half(rank: int, world: int, out: str, tag: str) -> None:
    """Killed (every worker) right after the checkpoint of step KILL committed: the
    samples it trained up to then are its part of the first half."""
    dist.init_process_group("gloo")
    os.environ["TANDEM_FAULTS"] = json.dumps(
        [*SLOW, {"step": KILL, "phase": "checkpoint", "kind": "raise"}])
    with pytest.raises(RuntimeError, match="injected"):
        _fit(out, tag)
    Path(out, f"{tag}-first-{rank}.json").write_text(json.dumps(toy_task.SEEN))
    dist.destroy_process_group()


def _second_half(rank: int, world: int, out: str, tag: str) -> None:
    dist.init_process_group("gloo")
    os.environ["TANDEM_FAULTS"] = json.dumps(SLOW)
    _fit(out, tag)
    Path(out, f"{tag}-second-{rank}.json").write_text(json.dumps(toy_task.SEEN))
    dist.destroy_process_group()


def _seen(out: Path, tag: str, half: str, world: int) -> list[int]:
    return sum((json.loads((out / f"{tag}-{half}-{r}.json").read_text())
                for r in range(world)), [])


@pytest.mark.timeout(300)
def test_an_async_checkpoint_resumes_at_another_world_size(tmp_path: Path) -> None:
    run_ranks(_first_half, 2, str(tmp_path), "up", timeout=150)
    run_ranks(_second_half, 3, str(tmp_path), "up", timeout=150)
    want = sorted(toy_task.reference(STEPS, GLOBAL)[1])
    for tag, before, after in (("up", 2, 3),):
        first, second = _seen(tmp_path, tag, "first", before), _seen(tmp_path, tag,
                                                                    "second", after)
        # The kill came after a checkpoint that the second half resumed from ...
        assert first and second, tag
        # ... and every sample of the run was trained once, none twice, none skipped.
        assert sorted(first + second) == want, tag
        ends = [torch.load(tmp_path / f"{tag}-end-{r}.pt", weights_only=True)
                for r in range(after)]
        assert all(torch.equal(ends[0][k], e[k]) for e in ends[1:] for k in ends[0]), tag
