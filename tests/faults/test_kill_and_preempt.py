"""A killed worker, a preempted job and a corrupt checkpoint lose nothing."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.faults import jobs


def _assert_same_weights(a: dict, b: dict) -> None:
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.mark.timeout(240)
def test_killed_worker_restarts_and_ends_bit_exact(tmp_path: Path) -> None:
    clean = jobs.run(tmp_path, jobs.command("clean"))
    assert clean.returncode == 0, clean.stderr
    kill = [{"rank": 1, "step": 13, "phase": "compute", "kind": "kill"}]
    # A synchronous save: the checkpoint of step 10 is committed before step 11 starts.
    killed = jobs.run(tmp_path, jobs.command("killed", 2, 1, *jobs.SYNC_SAVE), kill)
    assert killed.returncode == 0, killed.stderr
    _assert_same_weights(jobs.final_weights(tmp_path, "clean"),
                         jobs.final_weights(tmp_path, "killed"))
    kinds = [(e["kind"], e["step"]) for e in jobs.events(tmp_path, "killed")]
    assert ("restart", 10) in kinds and ("resume", 10) in kinds  # 3 steps redone <= 5
    assert jobs.status(tmp_path, "killed") == "completed"


@pytest.mark.timeout(240)
def test_kill_during_a_background_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    # Rank 1 dies after writing its shards of step 10, before the commit: the job
    # restarts from step 5 (10 never became visible) and still ends bit-exact.
    kill = [{"rank": 1, "step": 10, "phase": "checkpoint_write", "kind": "kill"}]
    killed = jobs.run(tmp_path, jobs.command("async", 2, 1), kill)
    assert killed.returncode == 0, killed.stderr
    kinds = [(e["kind"], e["step"]) for e in jobs.events(tmp_path, "async")]
    assert ("resume", 5) in kinds, (kinds, killed.stderr[-6000:])
    checkpoints = tmp_path / "runs" / "async" / "checkpoints"
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    clean = jobs.run(tmp_path, jobs.command("clean"))
    assert clean.returncode == 0, clean.stderr
    _assert_same_weights(jobs.final_weights(tmp_path, "clean"),
                         jobs.final_weights(tmp_path, "async"))


@pytest.mark.timeout(240)
def test_corrupt_checkpoint_falls_back_to_the_previous_good_one(tmp_path: Path) -> None:
    faults = [{"rank": 0, "step": 10, "phase": "checkpoint", "kind": "corrupt"},
              {"rank": 1, "step": 13, "phase": "compute", "kind": "kill"}]
    done = jobs.run(tmp_path, jobs.command("corrupt", 2, 1, *jobs.SYNC_SAVE), faults)
    assert done.returncode == 0, done.stderr
    assert "skipping bad checkpoint" in done.stderr and "step_000000010" in done.stderr
    kinds = [(e["kind"], e["step"]) for e in jobs.events(tmp_path, "corrupt")]
    assert ("resume", 5) in kinds
    clean = jobs.run(tmp_path, jobs.command("clean"))
    assert clean.returncode == 0, clean.stderr
    _assert_same_weights(jobs.final_weights(tmp_path, "clean"),
                         jobs.final_weights(tmp_path, "corrupt"))


@pytest.mark.timeout(240)
def test_sigterm_to_the_launcher_commits_and_the_rerun_continues(tmp_path: Path) -> None:
    slow = [{"rank": "*", "step": s, "kind": "slow", "seconds": 0.2} for s in range(8, 30)]
    cmd = jobs.command("preempted")
    job = subprocess.Popen(cmd, cwd=tmp_path, env=jobs.env(slow), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # wait until the workers train, then preempt
        if list((tmp_path / "runs" / "preempted" / "checkpoints").glob("step_000000005")):
            break
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 75, err
    assert jobs.status(tmp_path, "preempted") == "preempted"
    stopped = [e for e in jobs.events(tmp_path, "preempted") if e["kind"] == "preempted"]
    assert len(stopped) == 1 and stopped[0]["step"] < 30
    again = jobs.run(tmp_path, cmd)
    assert again.returncode == 0, again.stderr
    assert jobs.status(tmp_path, "preempted") == "completed"
    clean = jobs.run(tmp_path, jobs.command("clean"))
    assert clean.returncode == 0, clean.stderr
    _assert_same_weights(jobs.final_weights(tmp_path, "clean"),
                         jobs.final_weights(tmp_path, "preempted"))
