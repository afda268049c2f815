"""Stored states and exit statuses: the enums keep the stored strings and numbers."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tandem.launcher import local_agent
from tandem.monitor.store import STATUSES, RunStore
from tandem.sched.service import lifecycle
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.records import ACTIVE, DONE, STATES, Attempt, JobRecord
from tandem.status import (
    ACTIVE_JOB_STATES,
    AttemptOutcome,
    ExitStatus,
    JobStatus,
    RunStatus,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "tandem"
# The strings run stores written before the enums hold: they must still read.
STORED_JOB_STATES = ["queued", "running", "stopping", "completed", "failed", "cancelled"]
STORED_RUN_STATUSES = ["running", "completed", "failed", "preempted", "interrupted"]
# Added since: a run the scheduler cancelled (older code reads it as any other text).
NEW_RUN_STATUSES = ["cancelled"]


def _job(tmp: Path) -> JobRecord:
    script = tmp / "train.py"
    script.write_text("")
    return JobRecord(name="toy", script=str(script), cwd=str(tmp), run_dir=str(tmp / "runs"),
                     submitted=time.time())


def test_job_states_round_trip_through_the_store(tmp_path: Path) -> None:
    path = tmp_path / "tandem.db"
    assert [s.value for s in JobStatus] == STORED_JOB_STATES == list(STATES)
    with SchedStore(path) as sched:
        job = sched.submit(_job(tmp_path))
        assert job.state is JobStatus.QUEUED
        for state in STORED_JOB_STATES:  # plain strings, as an older writer stored them
            raw = sqlite3.connect(path)
            raw.execute("UPDATE sched_jobs SET state=? WHERE job_id=?", (state, job.job_id))
            raw.commit()
            raw.close()
            read = sched.job(job.job_id)
            assert read.state == state and isinstance(read.state, JobStatus)
            assert json.loads(json.dumps({"state": read.state})) == {"state": state}
        assert sched.update_job(job.job_id, None, state=JobStatus.STOPPING)
    raw = sqlite3.connect(path)
    stored = raw.execute("SELECT state, typeof(state) FROM sched_jobs").fetchone()
    raw.close()
    assert stored == ("stopping", "text")


def test_an_attempt_outcome_is_stored_as_its_old_string(tmp_path: Path) -> None:
    path = tmp_path / "tandem.db"
    with SchedStore(path) as sched:
        job = sched.submit(_job(tmp_path))
        assert sched.open_attempt(job.job_id, Attempt(job_id=job.job_id, attempt=1,
                                                      backend="local", procs=1,
                                                      launched=time.time()), 1, None)
        outcome = lifecycle.outcome_of(os.EX_TEMPFAIL)
        sched.close_attempt(job.job_id, 1, os.EX_TEMPFAIL, outcome, time.time())
        (attempt,) = sched.attempts(job.job_id)
    assert attempt.outcome is AttemptOutcome.STOPPED and attempt.outcome == "stopped"
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT outcome FROM sched_attempts").fetchone() == ("stopped",)
    raw.close()


def test_run_statuses_round_trip_through_the_run_store(tmp_path: Path) -> None:
    every = STORED_RUN_STATUSES + NEW_RUN_STATUSES
    assert [s.value for s in RunStatus] == every == list(STATUSES)
    with RunStore(tmp_path / "runs.db") as store:
        for status in every[1:]:
            store.start_run(f"r-{status}", status, {}, {}, {})
            assert store.run(f"r-{status}")["status"] == RunStatus.RUNNING
            store.finish_run(f"r-{status}", RunStatus(status), {})
            assert store.run(f"r-{status}")["status"] == status
        allowed = "completed, failed, preempted, interrupted, cancelled"
        with pytest.raises(ValueError, match=allowed):
            store.finish_run("r-failed", RunStatus.RUNNING, {})


def test_exit_statuses_are_the_conventional_numbers() -> None:
    assert ExitStatus.OK == 0
    assert ExitStatus.PREEMPTED == os.EX_TEMPFAIL
    assert ExitStatus.INTERRUPTED == 128 + signal.SIGINT
    assert ExitStatus.USAGE == 2
    # The launcher's agent loads the module by path (no torch): the same numbers.
    assert local_agent.ExitStatus is not ExitStatus
    assert {s.name: int(s) for s in local_agent.ExitStatus} == {s.name: int(s)
                                                                for s in ExitStatus}
    assert lifecycle.outcome_of(128 + signal.SIGINT) == AttemptOutcome.STOPPED
    assert lifecycle.outcome_of(2) == AttemptOutcome.USAGE
    assert lifecycle.outcome_of(1) == AttemptOutcome.FAILED
    assert lifecycle.outcome_of(None) == AttemptOutcome.LOST
    assert ACTIVE == ACTIVE_JOB_STATES and set(ACTIVE) | set(DONE) == set(JobStatus)


def test_no_job_state_literal_outside_the_enum_module() -> None:
    """A quoted job-only state ("queued", "stopping", "cancelled") in src/, or a quoted
    "running" in the scheduler or the dashboard, means a contract spelt out again."""
    only_jobs = re.compile(r"""["'](queued|stopping|cancelled)["']""")
    running = re.compile(r"""["']running["']""")
    found = []
    for path in [*SRC.rglob("*.py"), *SRC.rglob("*.js"), *SRC.rglob("*.html")]:
        if path.name == "status.py" or "vendor" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        shared = path.parent.name in ("sched", "dashboard", "static", "templates")
        for number, line in enumerate(text.splitlines(), 1):
            if only_jobs.search(line) or (shared and running.search(line)):
                found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
