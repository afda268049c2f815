"""Bad numbers, a silent rank and mismatched configs: handled by every rank together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.faults import jobs
from tests.reap import kill_tree

GLOBAL = 40


def _train(rank: int, world: int, out: str, faults: list, fault_cfg: dict) -> None:
    os.environ["TANDEM_FAULTS"] = json.dumps(faults)
    cfg = toy_task.config(out, 20, GLOBAL, checkpoint={"every": 5}, fault=fault_cfg,
                          monitor={"log_every": 5})
    result = tandem.fit(toy_task.task(), config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


def _events(out: Path) -> list[dict]:
    with RunStore(out / "tandem.db") as store:
        return store.events(store.runs()[-1]["run_id"])


@pytest.mark.timeout(120)
def test_nan_on_one_rank_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    nan = [{"rank": 1, "step": 7, "kind": "nan"}]
    run_ranks(_train, 2, str(tmp_path), nan, {"nonfinite": "skip"}, timeout=100)
    ref, _ = toy_task.reference(20, GLOBAL, skip=frozenset({7}))
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
    skips = [e for e in _events(tmp_path) if e["kind"] == "skip"]
    assert [e["step"] for e in skips] == [7]


@pytest.mark.timeout(120)
def test_nan_with_rollback_restores_the_last_checkpoint_and_skips_the_window(
        tmp_path: Path) -> None:
    nan = [{"rank": 0, "step": 12, "kind": "nan"}]
    cfg = {"nonfinite": "rollback", "rollback_lr_scale": 0.5}
    run_ranks(_train, 2, str(tmp_path), nan, cfg, timeout=100)
    rollbacks = [e for e in _events(tmp_path) if e["kind"] == "rollback"]
    assert len(rollbacks) == 1
    assert "to step_000000010" in rollbacks[0]["message"]
    assert "skipping 120 samples" in rollbacks[0]["message"]  # steps 10, 11, 12
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in got.values())
    assert not list((tmp_path / "toy" / "checkpoints").glob("step_000000012"))


def _train_windows_of_ten(rank: int, world: int, out: str, faults: list) -> None:
    os.environ["TANDEM_FAULTS"] = json.dumps(faults)
    cfg = toy_task.config(out, 25, GLOBAL, checkpoint={"every": 5},
                          fault={"nonfinite": "rollback"}, monitor={"log_every": 10})
    tandem.fit(toy_task.task(), config=cfg)


@pytest.mark.timeout(120)
def test_a_rollback_inside_a_logging_window_logs_the_steps_it_undoes(tmp_path: Path) -> None:
    # Steps 10-17 run, 17 is non-finite, the run goes back to step 15: the window holds
    # more steps than log_every once 15-19 run again unless the rollback ends it.
    nan = [{"rank": 0, "step": 17, "kind": "nan"}]
    run_ranks(_train_windows_of_ten, 2, str(tmp_path), nan, timeout=100)
    with RunStore(tmp_path / "tandem.db") as store:
        run = store.runs()[-1]
        assert run["status"] == "completed", run
        steps = [row["step"] for row in store.metrics(run["run_id"], "loss")]
    assert steps == sorted(set(steps)) and steps[-1] == 25
    assert 18 in steps  # the window closed by the rollback: steps 10-17
    assert [e["step"] for e in _events(tmp_path) if e["kind"] == "rollback"] == [18]


def _mismatched(rank: int, world: int, out: str) -> None:
    cfg = toy_task.config(out, 5, GLOBAL, seed=rank)  # each rank a different seed
    tandem.fit(toy_task.task(), config=cfg)


@pytest.mark.timeout(120)
def test_ranks_with_different_configs_refuse_to_train(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as err:
        run_ranks(_mismatched, 2, str(tmp_path), timeout=100)
    assert "ranks [0, 1] failed" in str(err.value)
    message = str(err.value)
    for rank in (0, 1):  # each rank says it, with the same words
        detail = message.split(f"rank {rank}:\n", 1)[1]
        assert "ranks [0] vs ranks [1]" in detail
    assert not (tmp_path / "toy").exists()  # refused before anything was written


@pytest.mark.timeout(150)
def test_a_stopped_rank_is_named_within_the_timeout(tmp_path: Path) -> None:
    stop = [{"rank": 1, "step": 8, "kind": "sigstop"}]
    cmd = jobs.command("hang", 2, 0, "--plan.timeout_s", "10", "--fault.heartbeat_s", "0.5")
    job = subprocess.Popen(cmd, cwd=tmp_path, env=jobs.env(stop), stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    started, lines = time.monotonic(), []
    try:
        for line in job.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "micro-batch" in line:  # the run's start: what came before is start-up,
                started = time.monotonic()  # whose length depends on the host
            if "ranks last seen: rank" in line:
                break
        waited = time.monotonic() - started
    finally:
        kill_tree(job)  # the launcher, its agent and both ranks, the stopped one too
    report = "".join(lines)
    assert "ranks last seen: rank" in report, report[-3000:]
    assert "rank 1: last seen" in report and "at step 8" in report
    # From the run's start: 8 steps, then the 10 s timeout; a hang would be the test's own.
    assert waited < 60


def _spiky(rank: int, world: int, out: str) -> None:
    os.environ["TANDEM_FAULTS"] = json.dumps([{"rank": "*", "step": 47, "kind": "spike"}])
    cfg = toy_task.config(out, 60, GLOBAL, checkpoint={"every": 5},
                          fault={"spike": "rollback"}, monitor={"log_every": 5})
    tandem.fit(toy_task.task(), config=cfg)


@pytest.mark.timeout(120)
def test_a_loss_spike_rolls_back_to_the_checkpoint_before_it(tmp_path: Path) -> None:
    run_ranks(_spiky, 2, str(tmp_path), timeout=100)
    events = _events(tmp_path)
    spikes = [e for e in events if e["kind"] == "loss_spike"]
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    assert spikes and spikes[0]["step"] == 47  # the bad step; later ones may follow it
    assert len(rollbacks) == 1 and "to step_000000045" in rollbacks[0]["message"]
    with RunStore(tmp_path / "tandem.db") as store:
        assert store.runs()[-1]["status"] == "completed"


class DyingLoaderData(toy_task.IndexedData):
    """The DataLoader worker that fetches sample 0 in the second epoch dies."""

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        marker = Path(os.environ["TANDEM_TEST_MARKER"])
        # Only the loader's workers count (the preflight reads sample 0 in the main process).
        if i == 0 and torch.utils.data.get_worker_info() is not None:
            if marker.exists():
                os.kill(os.getpid(), signal.SIGKILL)
            marker.touch()
        return super().__getitem__(i)


@pytest.mark.timeout(120)
def test_a_dead_loader_worker_stops_the_run_with_its_checkpoints_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem import checkpoint

    monkeypatch.setenv("TANDEM_TEST_MARKER", str(tmp_path / "seen-sample-0"))
    task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                       train_data=DyingLoaderData, loss=toy_task.loss)
    cfg = toy_task.config(str(tmp_path), 30, GLOBAL, checkpoint={"every": 2},
                          data={"workers": 1})
    # torch's SIGCHLD handler names the dead worker wherever the loop is; a death seen
    # first as a broken pipe while fetching is named by tandem.
    with pytest.raises(RuntimeError, match="DataLoader worker|loading the batch of step"):
        tandem.fit(task, config=cfg)
    good = checkpoint.latest(tmp_path / "toy" / "checkpoints")
    assert good is not None and int(good.name.split("_")[1]) >= 2
