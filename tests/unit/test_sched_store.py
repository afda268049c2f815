"""The scheduler's tables in the run store, and how an ended attempt moves its job on."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tandem.monitor.store import SCHEMA_VERSION, RunStore, StoreVersionError
from tandem.sched.service import lifecycle
from tandem.sched.service.jobstore import SCHED_SCHEMA_VERSION, SchedStore
from tandem.sched.service.records import Attempt, JobRecord


def _job(tmp: Path, name: str = "toy", **fields: object) -> JobRecord:
    script = tmp / "train.py"
    script.write_text("")
    return JobRecord(name=name, script=str(script), cwd=str(tmp), run_dir=str(tmp / "runs"),
                     submitted=time.time(), **fields)


def _attempt(job_id: str, number: int, procs: int = 1) -> Attempt:
    return Attempt(job_id=job_id, attempt=number, backend="local", procs=procs,
                   launched=time.time())


def test_tables_live_beside_the_runs_with_their_own_version(tmp_path: Path) -> None:
    path = tmp_path / "tandem.db"
    with SchedStore(path) as sched:
        job = sched.submit(_job(tmp_path))
    with RunStore(path) as runs:  # the runs' store still opens, at its own version
        runs.start_run("r1", "r", {}, {}, {})
    conn = sqlite3.connect(path)
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert meta["sched_schema_version"] == str(SCHED_SCHEMA_VERSION)
    assert {"runs", "metrics", "events", "sched_jobs", "sched_attempts"} <= tables
    assert conn.execute("SELECT job_id, state FROM sched_jobs").fetchall() == [
        (job.job_id, "queued")]
    conn.execute("UPDATE meta SET value='99' WHERE key='sched_schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError, match="scheduler schema version 99"):
        SchedStore(path)


def test_ids_names_and_one_open_attempt_per_job(tmp_path: Path) -> None:
    with SchedStore(tmp_path / "tandem.db") as sched:
        first = sched.submit(_job(tmp_path))
        second = sched.submit(_job(tmp_path))
        assert (first.job_id, second.job_id) == ("j1", "j2")
        assert (first.run_name, second.run_name) == ("toy-j1", "toy-j2")
        sched.submit(_job(tmp_path, run_name="shared"))
        with pytest.raises(ValueError, match="already used by active job j3"):
            sched.submit(_job(tmp_path, run_name="shared"))
        assert sched.open_attempt("j1", _attempt("j1", 1), 1, None)
        # A second launch of a running job is refused, and changes nothing.
        assert not sched.open_attempt("j1", _attempt("j1", 2), 2, None)
        assert [a.attempt for a in sched.attempts("j1")] == [1]
        assert sched.job("1").procs == 1 and sched.job("j1").state == "running"


def test_cancel_queued_at_once_running_through_the_service(tmp_path: Path) -> None:
    with SchedStore(tmp_path / "tandem.db") as sched:
        sched.submit(_job(tmp_path))
        sched.submit(_job(tmp_path))
        sched.open_attempt("j2", _attempt("j2", 1), 1, None)
        assert "cancelled" in sched.cancel("j1")
        assert sched.job("j1").state == "cancelled"
        assert "will stop" in sched.cancel("j2")
        assert sched.job("j2").state == "running" and sched.job("j2").cancel_requested
        # and a cancelled job is not launched again
        assert not sched.open_attempt("j1", _attempt("j1", 1), 1, None)
        with pytest.raises(ValueError, match="no job 'j9'"):
            sched.job("j9")


@pytest.mark.parametrize(("code", "state", "target", "expected"), [
    (0, "running", None, "completed"),
    (75, "stopping", 2, "stopping"),  # a resize: relaunched at 2 by the service
    (75, "stopping", 0, "queued"),  # a preemption
    (75, "running", None, "queued"),  # stopped by someone else (Slurm, an operator)
    (2, "running", None, "failed"),  # a usage error is not retried
    (1, "running", None, "queued"),  # a crash: resumed from its checkpoint
    (None, "running", None, "queued"),  # lost without a status
])
def test_settle(tmp_path: Path, code: int | None, state: str, target: int | None,
                expected: str) -> None:
    log = tmp_path / "log.txt"
    log.write_text("training ...\ntandem: error: --train.steps: -1 is not allowed\n\n")
    with SchedStore(tmp_path / "tandem.db") as sched:
        job = sched.submit(_job(tmp_path))
        sched.open_attempt(job.job_id, _attempt(job.job_id, 1), 1, None)
        if state == "stopping":
            sched.request_stop(job.job_id, 1, "resize", target or 0, None, time.time())
        got = lifecycle.settle(sched, sched.job(job.job_id), sched.attempts(job.job_id)[0],
                               code, time.time(), 3, log)
        after = sched.job(job.job_id)
        (attempt,) = sched.attempts(job.job_id)
    assert got == expected == after.state
    assert attempt.exit_code == code and attempt.ended is not None
    assert after.failures == (1 if code in (1, None) else 0)
    if code == 2:
        assert after.message == "tandem: error: --train.steps: -1 is not allowed"


def test_failures_beyond_the_limit_fail_and_cancel_wins(tmp_path: Path) -> None:
    with SchedStore(tmp_path / "tandem.db") as sched:
        job = sched.submit(_job(tmp_path))
        for number in (1, 2):
            sched.open_attempt(job.job_id, _attempt(job.job_id, number), 1, None)
            lifecycle.settle(sched, sched.job(job.job_id), sched.attempts(job.job_id)[-1],
                             1, time.time(), 1, tmp_path / "none.txt")
        assert sched.job(job.job_id).state == "failed"
        other = sched.submit(_job(tmp_path))
        sched.open_attempt(other.job_id, _attempt(other.job_id, 1), 1, None)
        sched.cancel(other.job_id)
        lifecycle.settle(sched, sched.job(other.job_id), sched.attempts(other.job_id)[0],
                         75, time.time(), 3, tmp_path / "none.txt")
        assert sched.job(other.job_id).state == "cancelled"


def test_unresized_job_assumes_the_resizes_measured_here(tmp_path: Path) -> None:
    from tandem.sched.backends.local_backend import LocalBackend
    from tandem.sched.policies.tiresias import TiresiasPolicy
    from tandem.sched.service.service import Service, ServiceOptions

    path = tmp_path / "tandem.db"
    with SchedStore(path) as sched:
        a = sched.submit(_job(tmp_path, "a"))
        b = sched.submit(_job(tmp_path, "b"))
    service = Service(path, LocalBackend(slots=2, warm=False), TiresiasPolicy(),
                      ServiceOptions(restart_delay_s=15.0))
    try:
        before = {s.record.job_id: s.default_restart_delay for s in service.states()}
        assert before == {a.job_id: 15.0, b.job_id: 15.0}  # nothing measured: the option
        for attempt, delay in ((1, 3.0), (2, 5.0), (3, 7.0)):
            service.store.record_resize({
                "job_id": a.job_id, "attempt": attempt, "kind": "resize", "decided": 100.0,
                "from_procs": 1, "to_procs": 2, "training_again": 100.0 + delay})
        service.store.record_resize({  # a preemption's restart waited in the queue
            "job_id": a.job_id, "attempt": 4, "kind": "preempt", "decided": 200.0,
            "from_procs": 2, "to_procs": 0, "training_again": 290.0})
        views = {s.record.job_id: s.view(service.store.epoch(), 300.0, service.cluster)
                 for s in service.states()}
    finally:
        service.store.close()
        service.runs.close()
    assert views[a.job_id].restart_delay == 5.0  # its own resizes
    assert views[b.job_id].restart_delay == 5.0  # the median of what was measured here
