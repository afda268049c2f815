"""How an ended attempt moves its job on, and what each stop and resize cost (recorded).

Exit statuses (from `tandem.sched.service.attempt`):

- 0: the run completed -> completed;
- 75 / 130: a graceful stop, the checkpoint committed -> relaunched at the size the
  decision chose (a resize), back to the queue (a preemption, also one the scheduler did
  not ask for: Slurm's, an operator's SIGTERM), or cancelled;
- 2: a usage error (the command, the config, the task) -> failed at once, with its line;
- anything else, or an attempt lost without a status (killed shim, dead actor, vanished
  node) -> resumed from its last checkpoint, up to `max_failures` times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.measured import Measured
from tandem.sched.service.records import Attempt, JobRecord
from tandem.status import GRACEFUL_EXITS, HOLDING_JOB_STATES, AttemptOutcome, ExitStatus, JobStatus

SIGTERM_STATUS = 128 + 15


def outcome_of(code: int | None, stop_requested: bool = False) -> str:
    """The name recorded for an attempt's end. A launcher ended by the SIGTERM it was sent
    (before its job could turn it into a commit) was stopped too: it resumes from its
    last checkpoint, as any stopped job does."""
    if code is None:
        return AttemptOutcome.LOST
    if code == ExitStatus.OK:
        return AttemptOutcome.COMPLETED
    if code in GRACEFUL_EXITS or (stop_requested and code == SIGTERM_STATUS):
        return AttemptOutcome.STOPPED
    if code == ExitStatus.USAGE:
        return AttemptOutcome.USAGE
    return AttemptOutcome.FAILED


def last_line(log_path: Path) -> str:
    """The last non-empty line of an attempt's log (why it failed, usually)."""
    try:
        with log_path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:500]


def settle(store: SchedStore, job: JobRecord, attempt: Attempt, code: int | None,
           ended: float, max_failures: int, log_path: Path) -> str:
    """Record the attempt's end and move its job to its next state; returns that state.

    A job left stopping with a positive target size is waiting to be relaunched at
    that size (the service does it as soon as the slots are free).
    """
    outcome = outcome_of(code, attempt.stop_requested is not None)
    store.close_attempt(job.job_id, attempt.attempt, code, outcome, ended)
    expect = HOLDING_JOB_STATES
    if job.cancel_requested and outcome != AttemptOutcome.COMPLETED:
        state = JobStatus.CANCELLED
        store.update_job(job.job_id, expect, state=state, procs=0, finished=ended,
                         message=f"cancelled (attempt {attempt.attempt}: {outcome})")
    elif outcome == AttemptOutcome.COMPLETED:
        state = JobStatus.COMPLETED
        store.update_job(job.job_id, expect, state=state, procs=0, finished=ended,
                         message=None)
    elif outcome == AttemptOutcome.USAGE:
        state = JobStatus.FAILED
        store.update_job(job.job_id, expect, state=state, procs=0, finished=ended,
                         message=last_line(log_path) or "usage error (exit status 2)")
    elif outcome == AttemptOutcome.STOPPED:
        resize = job.state == JobStatus.STOPPING and (job.target_procs or 0) > 0
        state = JobStatus.STOPPING if resize else JobStatus.QUEUED
        store.update_job(job.job_id, expect, state=state, procs=0)
    else:
        failures = job.failures + 1
        why = (f"attempt {attempt.attempt} {'was lost' if code is None else f'exited {code}'}"
               f": {last_line(log_path)}")
        if failures > max_failures:
            state = JobStatus.FAILED
            store.update_job(job.job_id, expect, state=state, procs=0, finished=ended,
                             failures=failures, message=f"{failures} failures; last: {why}")
        else:
            state = JobStatus.QUEUED
            store.update_job(job.job_id, expect, state=state, procs=0, failures=failures,
                             target_procs=None, target_batch=None, stop_reason=None,
                             message=f"resuming from its checkpoint after: {why}")
    return state


def stop_record(job: JobRecord, attempt: Attempt, kind: str, decided: float,
                to_procs: int, to_batch: int | None) -> dict[str, Any]:
    """The row that starts a stop's record (completed by `complete_record`)."""
    return {"job_id": job.job_id, "attempt": attempt.attempt, "kind": kind,
            "decided": decided, "from_procs": attempt.procs, "to_procs": to_procs,
            "from_batch": attempt.batch, "to_batch": to_batch}


def complete_record(row: dict[str, Any], attempts: list[Attempt], measured: Measured,
                    job_done: bool) -> dict[str, Any] | None:
    """Fill what the store now tells of a stop: when it ended, at which step, when the
    next attempt trained again and how many steps it redid. None while nothing new is
    known. A record is closed once the next attempt logged its first window, or ended
    without training, or the job ended without another attempt."""
    stopped = next((a for a in attempts if a.attempt == row["attempt"]), None)
    after = next((a for a in attempts if a.attempt == row["attempt"] + 1), None)
    if stopped is None or stopped.ended is None:
        return None
    new = dict(row)
    if new.get("stopped") is None:
        new["stopped"] = stopped.ended
        graceful = measured.first_event("preempted", row["decided"])
        if graceful is not None and graceful["time"] <= stopped.ended + 1.0:
            new["stopped_step"] = int(graceful["step"])
        else:  # not graceful: the last step the store saw before the attempt ended
            seen = [w.step for w in measured.windows if w.time <= stopped.ended]
            new["stopped_step"] = max(seen, default=0)
    if after is not None and new.get("training_again") is None:
        resumed = measured.first_event("resume", after.launched)
        if resumed is not None and (after.ended is None or resumed["time"] <= after.ended):
            new["training_again"] = resumed["time"]
            new["resumed_step"] = int(resumed["step"])
            new["steps_redone"] = max(0, int(new["stopped_step"]) - int(resumed["step"]))
        elif after.ended is not None:
            new["closed"] = 1  # the next attempt ended before it trained
    if after is not None and new.get("training_again") and not new.get("closed"):
        window = measured.first_window(new["training_again"])
        if window is not None and (after.ended is None or window.time <= after.ended):
            new["first_window"] = window.time
            new["closed"] = 1
    if after is None and job_done:
        new["closed"] = 1
    return None if new == row else new
