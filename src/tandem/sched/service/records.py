"""What the scheduler keeps of a live job and of each of its attempts (rows of the store).

A job's life:

    queued --launch--> running --stop (preempt/resize/cancel)--> stopping
      ^                   |                                        |
      |                   +--exit 0, run completed--> completed    +--exit 75--> queued
      +--failure (resumable)--+--exit 2 / too many failures--> failed     or relaunched
                                                                           at its new size
    cancelled: by `tandem cancel` (queued at once, running after a graceful stop)

An attempt is one launch of the job at one size: a `tandem run` process group under a
backend (a local process group, a Ray actor, a Slurm batch job). A job has at most one
open attempt at a time; the store enforces it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from tandem.status import ACTIVE_JOB_STATES, DONE_JOB_STATES, AttemptOutcome, JobStatus

STATES = tuple(JobStatus)
ACTIVE = ACTIVE_JOB_STATES
DONE = DONE_JOB_STATES
STOP_REASONS = ("preempt", "resize", "cancel")


@dataclass(kw_only=True)
class JobRecord:
    """One submitted job as the store holds it."""

    job_id: str = ""
    """`j<n>`, given at submission."""
    name: str
    """A label for people (default: the script's name)."""
    script: str
    """The training script, an absolute path."""
    args: list[str] = field(default_factory=list)
    """The script's own flags (`--section.key VALUE ...`), as submitted."""
    cwd: str
    """Directory the job runs in."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every attempt."""
    min_procs: int = 1
    max_procs: int = 1
    priority: int = 0
    adaptive_batch: bool = False
    """Whether the scheduler may relaunch the job with another global batch."""
    max_batch: int = 0
    """Largest global batch an adaptive job may get (0: four times its own)."""
    run_name: str = ""
    """`--run.name` of every attempt (the same run, resumed)."""
    run_dir: str = ""
    """`--run.dir` of every attempt."""
    submitted: float = 0.0
    state: JobStatus = JobStatus.QUEUED
    procs: int = 0
    """Processes held now (running or stopping)."""
    batch: int | None = None
    """Global batch the scheduler set for the current attempt (None: the job's own)."""
    target_procs: int | None = None
    """While stopping: the size to relaunch at (0: back to the queue)."""
    target_batch: int | None = None
    stop_reason: str | None = None
    decided: float | None = None
    """Wall time of the decision that is being carried out (stop, resize)."""
    cancel_requested: bool = False
    failures: int = 0
    """Attempts that ended without a graceful stop (each one resumed from its checkpoint)."""
    finished: float | None = None
    message: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> JobRecord:
        """A record from a `sched_jobs` row."""
        data = dict(row)
        data.pop("seq")
        data["args"] = json.loads(data["args"])
        data["env"] = json.loads(data["env"])
        data["adaptive_batch"] = bool(data["adaptive_batch"])
        data["cancel_requested"] = bool(data["cancel_requested"])
        data["state"] = JobStatus(data["state"])
        return cls(**data)


@dataclass(kw_only=True)
class Attempt:
    """One launch of a job at one size."""

    job_id: str
    attempt: int
    """1 for the first launch, then 2, 3 ..."""
    backend: str
    handle: dict[str, Any] = field(default_factory=dict)
    """How the backend finds the attempt again: pid, actor name, Slurm job id ..."""
    procs: int = 0
    batch: int | None = None
    launched: float = 0.0
    stop_requested: float | None = None
    stop_reason: str | None = None
    ended: float | None = None
    exit_code: int | None = None
    outcome: AttemptOutcome | None = None
    """completed, stopped (graceful, exit 75), failed, usage (exit 2), lost."""

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Attempt:
        """An attempt from a `sched_attempts` row."""
        data = dict(row)
        data["handle"] = json.loads(data["handle"])
        if data["outcome"] is not None:
            data["outcome"] = AttemptOutcome(data["outcome"])
        return cls(**data)

    def held(self, now: float) -> float:
        """Process-seconds this attempt has held (to `now` while it is open)."""
        end = self.ended if self.ended is not None else now
        return max(0.0, end - self.launched) * self.procs
