"""A scheduler's history written into a store through the scheduler's own code: SchedStore
(submit, open/close attempts, stops, decisions, resize records), lifecycle.settle and
lifecycle.complete_record over what the jobs' runs recorded (RunStore).

On a cluster of 4 slots, times in seconds after T0 (200 s before the store is written):

    j1 alpha 1:4  submitted 0, on 4 at 2; resized to 2 at 30 (graceful stop at 33,
                  step 300), on 2 at 34, trains again at 40 from step 300; completed at 80
    j2 beta  2:2  submitted 10, on 2 at 34, running
    j3 gamma 1:2  submitted 20, on 2 at 81; preempted at 100, lost at 102 (last window
                  step 120): queued again, its record still open
    j4 delta 1:1  submitted 40, priority 1, queued
    j5 eps   1:1  submitted 50, cancelled while queued (finished: when it was cancelled)
    j6 zeta  2:2  submitted 60, on 2 at 102, usage error at 110 (exit 2): failed
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tandem.monitor.store import RunStore
from tandem.sched.service import lifecycle
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.measured import read
from tandem.sched.service.records import Attempt, JobRecord
from tandem.status import ExitStatus

SERVICE_FACTS = "pid 4242 on testhost, backend local (1 x 4 slots), policy goodput"


@dataclass(frozen=True)
class History:
    """What the builder wrote that a test needs to find again."""

    t0: float
    run_ids: dict[str, str]  # job id -> id of its run in the runs table


def job(name: str, t0: float, at: float, procs: tuple[int, int], tmp: Path,
        priority: int = 0) -> JobRecord:
    """A job as `tandem submit` would store it, submitted at `t0 + at`."""
    return JobRecord(name=name, script=str(tmp / f"{name}.py"), cwd=str(tmp),
                     env={"SECRET_TOKEN": "never-shown"}, min_procs=procs[0],
                     max_procs=procs[1], priority=priority, run_dir=str(tmp / "runs"),
                     submitted=t0 + at)


def launch(store: SchedStore, job_id: str, number: int, procs: int, at: float) -> Attempt:
    """Open attempt `number` of a job on `procs` processes at wall time `at`."""
    attempt = Attempt(job_id=job_id, attempt=number, backend="local", procs=procs,
                      launched=at)
    assert store.open_attempt(job_id, attempt, procs, None)
    return attempt


def settle(store: SchedStore, job_id: str, attempt: Attempt, code: int | None,
           ended: float, log: Path) -> str:
    """End an attempt the way the service does (its job moves on)."""
    attempt = next(a for a in store.attempts(job_id) if a.attempt == attempt.attempt)
    return lifecycle.settle(store, store.job(job_id), attempt, code, ended, 3, log)


def stop(store: SchedStore, job_id: str, attempt: Attempt, kind: str, to_procs: int,
         decided: float) -> None:
    """Ask a running job to stop for a resize or a preemption, and start its record."""
    assert store.request_stop(job_id, attempt.attempt, kind, to_procs, None, decided)
    store.record_resize(lifecycle.stop_record(store.job(job_id), attempt, kind, decided,
                                              to_procs, None))


def complete_records(store: SchedStore, runs: RunStore) -> None:
    """Fill in the stop records from the attempts and the runs (the service's last step)."""
    for row in store.resizes():
        record = store.job(row["job_id"])
        new = lifecycle.complete_record(row, store.attempts(record.job_id),
                                        read(runs, record.run_name),
                                        record.state in ("completed", "failed", "cancelled"))
        if new is not None:
            store.record_resize(new)


def write_history(path: Path, tmp: Path) -> History:
    """Write the history above into the store at `path` (every connection closed after)."""
    t0 = time.time() - 200.0
    log = tmp / "attempt-log.txt"
    log.write_text("step 0\nerror: --train.stepz is not a field of the config\n")
    with SchedStore(path) as store, RunStore(path) as runs:
        store.set_service_value("service", SERVICE_FACTS)
        ids = [store.submit(job(name, t0, at, procs, tmp, priority)).job_id
               for name, at, procs, priority in (
                   ("alpha", 0, (1, 4), 0), ("beta", 10, (2, 2), 0), ("gamma", 20, (1, 2), 0),
                   ("delta", 40, (1, 1), 1), ("eps", 50, (1, 1), 0), ("zeta", 60, (2, 2), 0))]
        assert ids == ["j1", "j2", "j3", "j4", "j5", "j6"]
        name = {j.job_id: j.run_name for j in store.jobs()}
        store.record_decision("goodput", "local", {"j1": 4}, {"j1": "start on 4"})
        a1 = launch(store, "j1", 1, 4, t0 + 2)
        runs.start_run("run-alpha", name["j1"], {"train": {"global_batch": 64}}, {}, {})
        runs.log_metrics("run-alpha", [(s, -1, "samples_per_s", 900.0, t0 + 2 + s / 10)
                                       for s in range(50, 301, 50)])
        store.record_decision("goodput", "local", {"j1": 2, "j2": 2},
                              {"j1": "resize 4 -> 2", "j2": "start on 2"})
        stop(store, "j1", a1, "resize", 2, t0 + 30)
        runs.log_event("run-alpha", 300, -1, "preempted", "stop requested", time_s=t0 + 32.5)
        assert settle(store, "j1", a1, ExitStatus.PREEMPTED, t0 + 33, log) == "stopping"
        a2 = launch(store, "j1", 2, 2, t0 + 34)
        launch(store, "j2", 1, 2, t0 + 34)
        runs.log_event("run-alpha", 300, -1, "resume", "resumed from step 300", time_s=t0 + 40)
        runs.log_metrics("run-alpha", [(350, -1, "samples_per_s", 480.0, t0 + 42)])
        assert settle(store, "j1", a2, 0, t0 + 80, log) == "completed"
        runs.finish_run("run-alpha", "completed", {"steps": 600})
        runs.start_run("run-beta", name["j2"], {}, {}, {})
        g1 = launch(store, "j3", 1, 2, t0 + 81)
        runs.start_run("run-gamma", name["j3"], {}, {}, {})
        runs.log_metrics("run-gamma", [(120, -1, "samples_per_s", 300.0, t0 + 95)])
        store.record_decision("goodput", "local", {"j2": 2, "j3": 0, "j4": 0, "j6": 2},
                              {"j3": "preempt 2 -> 0", "j6": "start on 2"})
        stop(store, "j3", g1, "preempt", 0, t0 + 100)
        assert settle(store, "j3", g1, None, t0 + 102, log) == "queued"  # lost, no status
        z1 = launch(store, "j6", 1, 2, t0 + 102)
        assert settle(store, "j6", z1, 2, t0 + 110, log) == "failed"
        store.cancel("j5")
        complete_records(store, runs)
    return History(t0=t0, run_ids={"j1": "run-alpha", "j2": "run-beta", "j3": "run-gamma"})
