"""Bounded-staleness asynchronous updates: s = 0 against DiLoCo's math computed in one
process, a slowed worker that holds nobody while every sample is used once, and a
kill/resume that loses no sample."""

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
from tests.dist import toy_task
from tests.dist.procs import run_ranks

WORLD, GLOBAL, H, STEPS = 3, 30, 4, 26
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9
SLOW, SLOW_STEPS = 2, 60  # the rank slowed in the second run, and its length
SLOW_FAULT = [{"rank": SLOW, "step": 0, "until": 10**6, "kind": "slow", "seconds": 0.04}]


def _sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.05)


class Committed(tandem.Component):
    """Notes how many samples this rank had trained on when each checkpoint committed."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def after_checkpoint(self, moment: str, step: int, path: Path) -> None:
        if moment == "committed":
            self.seen[step] = len(toy_task.SEEN)


def _fit(out: str, tag: str, staleness: int, steps: int, every: int = 0,
         components: tuple = ()) -> None:
    toy_task.SEEN.clear()
    task = tandem.Task(model=toy_task.make_model, optimizer=_sgd,
                       train_data=toy_task.IndexedData, loss=toy_task.loss)
    cfg = toy_task.config(str(Path(out, tag)), steps, GLOBAL, monitor={"log_every": 8},
                          plan={"strategy": "async", "staleness": staleness, "sync_every": H},
                          checkpoint={"every": every, "at_end": False, "async_save": False})
    result = tandem.fit(task, config=cfg, components=components)
    rank = dist.get_rank()
    torch.save(result.model.state_dict(), Path(out, f"{tag}-{rank}.pt"))
    Path(out, f"{tag}-seen-{rank}.json").write_text(json.dumps(toy_task.SEEN))


def _runs(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")  # one group for all the runs
    _fit(out, "sync", 0, STEPS)
    # s = 2, one worker slowed, killed at 60% (each worker at its first share of batch 36
    # or later) and resumed from the checkpoint of step 20.
    os.environ["TANDEM_FAULTS"] = json.dumps(
        [*SLOW_FAULT, {"step": 36, "until": SLOW_STEPS, "kind": "raise"}])
    committed = Committed()
    with pytest.raises(RuntimeError, match="injected"):
        _fit(out, "slow", 2, SLOW_STEPS, every=20, components=(committed,))
    first = toy_task.SEEN[:committed.seen[20]]
    os.environ["TANDEM_FAULTS"] = json.dumps(SLOW_FAULT)
    _fit(out, "slow", 2, SLOW_STEPS, every=20)
    Path(out, f"slow-seen-{rank}.json").write_text(json.dumps(first + toy_task.SEEN))
    dist.destroy_process_group()


def diloco_reference(steps: int) -> dict:
    """WORLD replicas in one process, each training on its share of every global batch;
    every H steps (and after the last) the mean change is DiLoCo's outer Nesterov step and
    every replica takes the outer parameters."""
    data, reps, opts, outer, velocity = toy_task.replicas(WORLD, _sgd)
    order = toy_task.reference(steps, GLOBAL)[1]
    for step in range(steps):
        ids = order[step * GLOBAL:(step + 1) * GLOBAL]
        toy_task.inner_steps(data, reps, opts, ids)
        if (step + 1) % H == 0 or step + 1 == steps:
            g = sum(outer - parameters_to_vector(r.parameters()).detach() for r in reps) / WORLD
            velocity = OUTER_MOMENTUM * velocity + g
            outer = outer - OUTER_LR * (g + OUTER_MOMENTUM * velocity)
            for r in reps:
                with torch.no_grad():
                    vector_to_parameters(outer.clone(), r.parameters())
    return reps[0].state_dict()


def _seen(out: Path, tag: str) -> list[list[int]]:
    return [json.loads((out / f"{tag}-seen-{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(300)
def test_staleness_zero_is_diloco_a_slow_worker_holds_nobody_and_a_resume_loses_nothing(
        tmp_path: Path) -> None:
    run_ranks(_runs, WORLD, str(tmp_path), timeout=280)
    # s = 0: DiLoCo's weights, on every worker.
    want = diloco_reference(STEPS)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"sync-{rank}.pt", weights_only=True)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)

    # s = 2 with one worker sleeping 40 ms in each of its steps (a fast step takes a few
    # ms), killed and resumed: the samples trained before the checkpoint and after the
    # resume are the run's global batches, each sample once ...
    seen = _seen(tmp_path, "slow")
    assert sorted(sum(seen, [])) == sorted(toy_task.reference(SLOW_STEPS, GLOBAL)[1])
    # ... the slow worker took far fewer shares than each fast one instead of holding them
    # to its pace (in lockstep every worker takes one share of each global batch) ...
    steps = [len(s) // (GLOBAL // WORLD) for s in seen]
    fast = [n for r, n in enumerate(steps) if r != SLOW]
    assert steps[SLOW] * 2 < min(fast), steps
    # ... the workers end with one model, and the run store has each worker's staleness,
    # never above the bound.
    weights = [torch.load(tmp_path / f"slow-{r}.pt", weights_only=True) for r in range(WORLD)]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])
    with RunStore(tmp_path / "slow" / "tandem.db") as store:
        run_id = store.runs()[-1]["run_id"]
        stale = store.metrics(run_id, name="async/staleness_max")
        local = store.metrics(run_id, name="async/local_steps")
    assert stale and max(m["value"] for m in stale) <= 2
    assert {m["rank"] for m in local if m["rank"] >= 0} == set(range(WORLD))
