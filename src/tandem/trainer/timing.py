"""Clocks of the run: wall time over all attempts, and training time per logging window."""

from __future__ import annotations

import time


class RunClock:
    """Wall time of the run over all its attempts."""

    def __init__(self, before: float) -> None:
        self.before = before
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds of this run so far, earlier attempts included."""
        return self.before + time.perf_counter() - self.start


class WindowClock:
    """Steps, forward/backward passes and training time since the last log line."""

    def __init__(self) -> None:
        self.steps = 0
        self.passes = 0  # micro-batches (forward + backward) in the window
        self.lr = 0.0
        self.busy = 0.0
        self.start = time.perf_counter()

    def add_step(self, passes: int) -> None:
        """One optimizer step of `passes` forward/backward passes was trained."""
        self.steps += 1
        self.passes += passes

    def pause(self) -> None:
        """Stop counting: what follows is not a training step."""
        self.busy += time.perf_counter() - self.start

    def resume(self) -> None:
        """Count again from now."""
        self.start = time.perf_counter()

    def clear(self) -> None:
        """Start a new window."""
        self.steps = 0
        self.passes = 0
        self.busy = 0.0
