"""The execution evaluation finds what was planted: a straggler, a slow input, slow comm."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import tandem
from tandem.parallel.ddp import DDPStrategy
from tandem.analyze.diagnose import diagnose
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
        wrap = DDPStrategy._wrap

        def slow_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            time.sleep(0.03)  # a slow link: the all-reduce cannot hide behind backward
            return dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future().then(
                lambda fut: fut.value()[0])

        def wrap_slow(self, model):  # type: ignore[no-untyped-def]
            model = wrap(self, model)
            if isinstance(model, DistributedDataParallel):
                model.register_comm_hook(None, slow_hook)
            return model

        DDPStrategy._wrap = wrap_slow  # type: ignore[method-assign]
    cfg = toy_task.config(out, 40, 40, monitor={"log_every": 5, "calibrate_at": 5},
                          checkpoint={"at_end": False})
    tandem.fit(task, config=cfg)


def _findings(out: Path) -> tuple[dict[str, dict], list[dict]]:
    with RunStore(out / "tandem.db") as store:
        run_id = store.runs()[-1]["run_id"]
        metrics, events = store.metrics(run_id), store.events(run_id)
    found = diagnose(metrics, events)
    return {f.kind: f.evidence for f in found}, metrics


@pytest.mark.timeout(120)
def test_a_slow_rank_is_flagged_as_straggler(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), "straggler", timeout=100)
    found, metrics = _findings(tmp_path)
    assert "straggler" in found and found["straggler"]["rank"] == 1
    scores = [m["value"] for m in metrics if m["name"] == "straggler/score" and m["rank"] == 1]
    assert min(scores[1:]) > 1.15


@pytest.mark.timeout(120)
def test_a_slow_dataset_is_diagnosed_input_bound(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), "input", timeout=100)
    found, _ = _findings(tmp_path)
    assert "input-bound" in found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2])
def test_exposed_communication_is_measured(tmp_path: Path, world: int) -> None:
    run_ranks(_fit, world, str(tmp_path), "comm", timeout=100)
    _, metrics = _findings(tmp_path)
    exposed = [m["value"] for m in metrics if m["name"] == "time/comm_exposed"]
    if world == 1:
        assert exposed and max(exposed) == 0.0
    else:
        assert exposed and min(exposed) > 0.02  # the 30 ms sleep, less any overlap
