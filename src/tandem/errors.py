"""The errors tandem reports to the person at the keyboard rather than as a crash."""

from __future__ import annotations

from tandem.status import ExitStatus

USAGE_EXIT_CODE = ExitStatus.USAGE  # the name callers know; the value lives in ExitStatus


class UsageError(ValueError):
    """A mistake in the task, the config or the command, seen alike by every process.

    Raised only where all processes agree (the same check on the same input, or a
    failure every process was told of), so every process can stop at once and cleanly;
    reported in one message, once, with exit status 2, and nothing written for the run.
    """


class PreflightError(UsageError):
    """A check before the first step failed on one or more processes."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks  # the processes that saw the problem, lowest first
