"""The execution evaluation finds what was planted: a straggler, a slow input, slow comm."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import tandem
from tandem.analyze.diagnosis.diagnose import diagnose_run
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks


class SlowData(toy_task.IndexedData):
    """Every sample costs 2 ms to load: the input pipeline is the bottleneck."""

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        time.sleep(0.002)
        return super().__getitem__(i)


def _fit(rank: int, world: int, out: str, case: str) -> None:
    task = toy_task.task()
    if case == "straggler":
        slow = [{"rank": 1, "step": s, "kind": "slow", "seconds": 0.03} for s in range(40)]
        os.environ["TANDEM_FAULTS"] = json.dumps(slow)
    elif case == "input":
        task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                           train_data=SlowData, loss=toy_task.loss)
    elif case == "comm":
        allreduce = default_hooks.allreduce_hook

        def slow_link(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            time.sleep(0.03)  # a slow link: the all-reduce cannot hide behind backward
            return allreduce(state, bucket)

        default_hooks.allreduce_hook = slow_link
    # The slow link is the process group's: its hook is the one made slow above.
    plan = {"host_allreduce": "backend"} if case == "comm" else {}
    cfg = toy_task.config(out, 40, 40, monitor={"log_every": 5, "calibrate_at": 5},
                          checkpoint={"at_end": False}, plan=plan)
    tandem.fit(task, config=cfg)


def _diagnosis(out: Path) -> tuple[list, list[dict]]:
    with RunStore(out / "tandem.db") as store:
        run = store.runs()[-1]
        metrics, events = store.metrics(run["run_id"]), store.events(run["run_id"])
    return diagnose_run(run, metrics, events), metrics


def _findings(out: Path) -> tuple[dict[str, dict], list[dict]]:
    found, metrics = _diagnosis(out)
    return {f.kind: f.evidence for f in found}, metrics


@pytest.mark.timeout(120)
def test_a_slow_rank_is_flagged_as_straggler(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), "straggler", timeout=100)
    found, metrics = _diagnosis(tmp_path)
    named = {f.kind: f for f in found}
    assert "straggler" in named and named["straggler"].evidence["rank"] == 1
    assert named["straggler"].message.startswith("workers wait for a straggler")
    assert any("plan.strategy async" in s for s in named["straggler"].suggestions)
    scores = [m["value"] for m in metrics if m["name"] == "straggler/score" and m["rank"] == 1]
    assert min(scores[1:]) > 1.15


@pytest.mark.timeout(120)
def test_a_slow_dataset_is_diagnosed_input_bound(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), "input", timeout=100)
    found, _ = _findings(tmp_path)
    assert "input-bound" in found


def _job(metrics: list[dict], name: str) -> list[float]:
    return [m["value"] for m in metrics if m["name"] == name and m["rank"] == -1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2])
def test_a_slow_link_is_exposed_wire_not_waiting(tmp_path: Path, world: int) -> None:
    run_ranks(_fit, world, str(tmp_path), "comm", timeout=100)
    _, metrics = _findings(tmp_path)
    exposed, wait = _job(metrics, "time/comm_exposed"), _job(metrics, "time/sync_wait")
    if world == 1:  # nothing is communicated
        assert exposed and max(exposed) == 0.0 and max(wait) == 0.0
    else:  # every rank waits the 30 ms in its hook: wire, the same on both ranks
        assert exposed and min(exposed) > 0.025
        assert max(wait) < 0.01


@pytest.mark.timeout(120)
def test_a_slow_rank_makes_the_others_wait_not_the_wire(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), "straggler", timeout=100)
    _, metrics = _findings(tmp_path)
    exposed, wait = _job(metrics, "time/comm_exposed"), _job(metrics, "time/sync_wait")
    # Rank 1 sleeps 30 ms each step: rank 0 waits for it in the all-reduce (a mean wait
    # of 15 ms over the two ranks), while the exposed wire stays small.
    waits = wait[1:]
    assert waits and min(waits) > 0.01 and max(exposed[1:]) < 0.01
    rank0 = [m["value"] for m in metrics if m["name"] == "time/comm_tail" and m["rank"] == 0]
    rank1 = [m["value"] for m in metrics if m["name"] == "time/comm_tail" and m["rank"] == 1]
    assert min(rank0[1:]) > 0.02 > max(rank1[1:])
