"""The everyday paths, as a user meets them: Ctrl-C, two launches of one run, a mistake
seen by one rank only, an evaluation that fails after training, a full disk."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.monitor.store import RunStore
from tests.faults import jobs
from tests.reap import kill_tree

ROOT = Path(__file__).resolve().parents[2]
SLOW = [{"rank": "*", "step": s, "kind": "slow", "seconds": 0.25} for s in range(6, 40)]


def _start(cmd: list[str], cwd: Path, faults: list[dict] | None = None,
           **env: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env={**jobs.env(faults), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, what: str, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if path.exists():
            return
        time.sleep(0.1)
    pytest.fail(f"{what} did not appear within {deadline_s} s")


def _checkpoint_names(cwd: Path, name: str) -> list[str]:
    root = cwd / "runs" / name / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["python", "tandem run"])
def test_ctrl_c_commits_at_a_step_boundary_and_the_rerun_continues(tmp_path: Path,
                                                                   launcher: str) -> None:
    name = "ctrlc"
    if launcher == "python":
        cmd = [sys.executable, jobs.SCRIPT, "--run.name", name, "--train.steps", "30",
               "--train.global_batch", "40", "--checkpoint.every", "5",
               "--monitor.log_every", "5", "--monitor.progress", "log"]
    else:
        cmd = jobs.command(name)
    job = _start(cmd, tmp_path, SLOW)
    try:
        _wait_for(tmp_path / "runs" / name / "checkpoints" / "step_000000005", "step 5")
        job.send_signal(signal.SIGINT)  # a terminal sends it to the foreground job
        _, err = job.communicate(timeout=90)
    finally:
        if job.poll() is None:
            kill_tree(job)
    assert job.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    with RunStore(tmp_path / "runs" / "tandem.db") as store:
        run = store.run(name)
        stopped = [e for e in store.events(run["run_id"]) if e["kind"] == "interrupted"]
    assert run["status"] == "interrupted" and len(stopped) == 1
    step = stopped[0]["step"]
    assert f"step_{step:09d}" in _checkpoint_names(tmp_path, name)
    again = jobs.run(tmp_path, cmd)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and f"at step {step}" in again.stderr


@pytest.mark.timeout(240)
def test_a_second_ctrl_c_stops_at_once_and_leaves_the_checkpoints_good(tmp_path: Path) -> None:
    # Every save after step 5 takes 20 s to write, so the second press lands while the
    # first press's checkpoint is still being written: a stop that waited for it would
    # outlast the 10 s allowed below.
    stuck_save = [{"rank": "*", "step": s, "phase": "checkpoint_write", "kind": "slow",
                   "seconds": 20.0} for s in range(6, 40)]
    job = _start(jobs.command("twice"), tmp_path, SLOW + stuck_save)
    try:
        _wait_for(tmp_path / "runs" / "twice" / "checkpoints" / "step_000000005", "step 5")
        job.send_signal(signal.SIGINT)
        time.sleep(1.5)  # a second, separate press
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=10)
    finally:
        if job.poll() is None:
            kill_tree(job)
    assert job.returncode != 0 and "second Ctrl-C" in err
    again = jobs.run(tmp_path, jobs.command("twice"))  # the committed state resumes
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr


@pytest.mark.timeout(240)
def test_a_second_launch_of_a_running_run_is_refused(tmp_path: Path) -> None:
    crawl = [{"rank": "*", "step": s, "kind": "slow", "seconds": 2.0} for s in range(6, 40)]
    first = _start(jobs.command("shared"), tmp_path, crawl)
    try:
        _wait_for(tmp_path / "runs" / "shared" / "checkpoints" / "step_000000005", "step 5")
        second = jobs.run(tmp_path, jobs.command("shared", 1), timeout=90)
        assert second.returncode == 2, second.stderr
        lines = [ln for ln in second.stderr.splitlines() if "tandem: error" in ln]
        assert len(lines) == 1 and "is in use by pid" in lines[0], second.stderr
        assert first.poll() is None  # the first run goes on, untouched
    finally:
        kill_tree(first)


FAIL_ON_RANK_1 = """
import torch
import tandem
from tests.dist import toy_task

class Data(toy_task.IndexedData):
    def __getitem__(self, i):
        if torch.distributed.get_rank() == 1:
            raise OSError("shard /data/part-1 is unreadable")
        return super().__getitem__(i)

task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=Data, loss=toy_task.loss)
if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 5, "train.global_batch": 20})
"""


@pytest.mark.timeout(180)
def test_a_mistake_one_rank_sees_is_said_once(tmp_path: Path) -> None:
    script = tmp_path / "one_rank.py"
    script.write_text(FAIL_ON_RANK_1)
    done = jobs.run(tmp_path, [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node",
                               "2", str(script), "--run.name", "one"])
    assert done.returncode == 2, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "unreadable" in ln]
    assert len(said) == 1 and "reading sample" in said[0], done.stderr
    assert "rank 1 failed its checks" in done.stderr
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    assert not (tmp_path / "runs" / "one").exists()


BAD_METRIC = """
import tandem
from tests.dist import toy_task

def error(out, batch):
    return (out - batch[1]).abs().mean(1)  # a vector: fails only at evaluation

task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, eval_data=toy_task.IndexedData,
                   loss=toy_task.loss, metrics={"err": error})
if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 6, "train.global_batch": 20,
                               "monitor.progress": "log"})
"""


@pytest.mark.timeout(180)
def test_a_failing_last_evaluation_keeps_the_training(tmp_path: Path) -> None:
    script = tmp_path / "bad_metric.py"
    # A metric that passes the preflight (one training batch of 20) and returns a vector
    # on the evaluation's batch of 200: it fails only after training.
    script.write_text(BAD_METRIC.replace(
        "return (out - batch[1]).abs().mean(1)",
        "v = (out - batch[1]).abs().mean(1)\n    return v if len(v) > 20 else v.mean()"))
    first = jobs.run(tmp_path, [sys.executable, str(script), "--run.name", "evalfail"])
    assert first.returncode != 0
    assert "its checkpoint is committed" in first.stderr, first.stderr
    assert _checkpoint_names(tmp_path, "evalfail") == ["step_000000006"]
    script.write_text(BAD_METRIC.replace("abs().mean(1)", "abs().mean()"))
    again = jobs.run(tmp_path, [sys.executable, str(script), "--run.name", "evalfail"])
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp_path / "runs" / "evalfail" / "summary.json").read_text())
    assert summary["steps"] == 6 and "err" in summary  # evaluated, not trained again


FULL_DISK = """
import errno, os
import tandem
from tandem.checkpoint import CheckpointError, manager
from tests.dist import toy_task

real = manager.write_shards
def full_at_step_10(tmp, state, group):  # the writer's OSError, as DCP reports it
    if "step_000000010" in str(tmp):
        raise CheckpointError(f"writing checkpoint into {tmp} failed: "
                              + os.strerror(errno.ENOSPC))
    return real(tmp, state, group)
manager.write_shards = full_at_step_10

task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, loss=toy_task.loss)
if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 15, "train.global_batch": 20,
                               "checkpoint.every": 5, "checkpoint.keep": 3})
"""


@pytest.mark.timeout(180)
def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "full_disk.py"
    script.write_text(FULL_DISK)
    failed = jobs.run(tmp_path, [sys.executable, str(script), "--run.name", "full"])
    assert failed.returncode != 0 and os.strerror(errno.ENOSPC) in failed.stderr
    assert _checkpoint_names(tmp_path, "full") == ["step_000000005"]
    checkpoints = tmp_path / "runs" / "full" / "checkpoints"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    again = jobs.run(tmp_path, [sys.executable, jobs.SCRIPT, "--run.name", "full",
                                "--train.steps", "15", "--train.global_batch", "20",
                                "--checkpoint.every", "5", "--checkpoint.keep", "3"])
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stderr and "at step 5" in again.stderr


@pytest.fixture
def tiny_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 4 MiB tmpfs of its own (root only; skipped where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip() or made.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Take every free byte of `disk` (writing until ENOSPC)."""
    ballast = disk / "ballast"
    with open(ballast, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return ballast


@pytest.mark.timeout(240)
def test_a_really_full_disk_keeps_the_previous_checkpoint(tmp_path: Path,
                                                          tiny_disk: Path) -> None:
    store = str(tmp_path / "tandem.db")
    cmd = [sys.executable, jobs.SCRIPT, "--run.name", "full", "--run.dir", str(tiny_disk),
           "--monitor.store", store, "--train.steps", "15", "--train.global_batch", "20",
           "--checkpoint.every", "5", "--checkpoint.keep", "3", "--monitor.log_every", "5"]
    job = _start(cmd, tmp_path, SLOW)
    try:
        _wait_for(tiny_disk / "full" / "checkpoints" / "step_000000005", "step 5")
        ballast = _fill(tiny_disk)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            kill_tree(job)
    assert job.returncode != 0 and "No space left on device" in err, err
    checkpoints = tiny_disk / "full" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000000005"]
    ballast.unlink()
    again = jobs.run(tmp_path, cmd)
    assert again.returncode == 0, again.stderr
    assert "at step 5" in again.stderr
