"""The states and exit statuses that cross a process or a store: one enum each.

A scheduled job's state, a run's status and an attempt's outcome are stored as text in
SQLite and read by other processes (the scheduler service, `tandem jobs`, the
dashboard); an exit status is how a launcher tells the scheduler and the shell what
happened. Each is a `StrEnum` or `IntEnum`, so the stored strings, the JSON and the
numbers stay what they were, and a misspelt state fails at import.

Imports nothing of tandem's or torch's: the launcher's agent loads this file by path
and the dashboard imports it without the scheduler.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class JobStatus(StrEnum):
    """A scheduled job's state (`sched_jobs.state`).

    queued -> running -> completed | failed; running -> stopping (graceful stop for a
    resize or a preemption) -> running at the new size, or queued; any -> cancelled.
    """

    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_JOB_STATES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.STOPPING)
HOLDING_JOB_STATES = (JobStatus.RUNNING, JobStatus.STOPPING)  # processes held now
DONE_JOB_STATES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class RunStatus(StrEnum):
    """A training run's status in the run store (`runs.status`)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    PREEMPTED = "preempted"  # stopped gracefully by SIGTERM: resumable
    INTERRUPTED = "interrupted"  # stopped gracefully by Ctrl-C: resumable
    # stopped gracefully by the scheduler for `tandem cancel`: committed, not resumed by it
    # (its events still say "preempted": the scheduler's measurements read that kind)
    CANCELLED = "cancelled"


class AttemptOutcome(StrEnum):
    """How one attempt of a scheduled job ended (`sched_attempts.outcome`)."""

    COMPLETED = "completed"  # exit 0
    STOPPED = "stopped"  # a graceful stop (exit 75 or 130): resumes from its checkpoint
    USAGE = "usage"  # exit 2: the command, config or task is wrong
    FAILED = "failed"  # any other status
    LOST = "lost"  # no status came back (killed shim, dead actor, vanished node)
    LAUNCH_FAILED = "launch-failed"  # the backend could not start it


class ExitStatus(IntEnum):
    """What `tandem run`, a training script and the attempt shim exit with."""

    OK = 0
    USAGE = 2  # a mistake in the command, the config or the task: fix it, run again
    PREEMPTED = 75  # EX_TEMPFAIL: a graceful stop, checkpoint committed, try again later
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


GRACEFUL_EXITS = (ExitStatus.PREEMPTED, ExitStatus.INTERRUPTED)
