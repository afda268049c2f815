"""Where a process's start-up went, from the process's start to its first step.

Every worker, restart and resize pays its start-up again, so the run's summary says what
it was made of (`startup_parts_s`): the interpreter and the imports before `fit` was
called (only for the process's first run: a second `fit` in the same process starts at
its call), the process group, building the run (data, model, strategy, optimizer), the
checks before the first step (`preflight`: the trial step and the ranks' agreement),
the resume, and what is left (`other`: configuration, the run directory, the store).
The calibration, which runs a few steps in, is priced apart (`calibration_s`, and its
parts in `calibration_parts_s`).

One record per process: a run's phases are timed where they happen, without handing a
clock through every layer between `fit` and the trial step.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import psutil

PARTS = ("before_fit", "runtime", "build", "preflight", "resume")


class StartupSplit:
    """Seconds spent in each start-up phase of this process's current run."""

    def __init__(self) -> None:
        self.runs = 0
        self.began = 0.0  # when the phases began (time.time()): the process's start first
        self.parts: dict[str, float] = {}

    def begin(self) -> None:
        """A run starts (`fit` was called): the first of the process counts from the
        process's start, a later one from now."""
        now = time.time()
        self.parts = dict.fromkeys(PARTS, 0.0)
        if self.runs == 0:
            self.began = process_started_at()
            self.parts["before_fit"] = max(0.0, now - self.began)
        else:
            self.began = now
        self.runs += 1

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Add the block's wall time to phase `name` (one of PARTS)."""
        if name not in PARTS:
            raise ValueError(f"start-up part {name!r} is not one of {PARTS}")
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.parts:  # outside a run (a check called on its own): not recorded
                self.parts[name] += time.perf_counter() - started

    def figures(self, first_step_at: float) -> dict[str, float]:
        """{"total": process start (or `fit`'s call) to the first step, each part, and
        "other": what the parts leave of the total}, in seconds."""
        total = max(0.0, first_step_at - self.began)
        out = {"total": total, **self.parts}
        out["build"] = max(0.0, out["build"] - out["preflight"])  # the checks run inside it
        out["other"] = max(0.0, total - sum(out[name] for name in PARTS))
        return out


def process_started_at() -> float:
    """When this process started (time.time()), to the kernel's clock tick on Linux.

    psutil's `create_time` adds the start to the boot time, which Linux gives in whole
    seconds: up to a second early. The process's age (the uptime less its start, both
    since boot) is exact to a tick.
    """
    try:
        with open("/proc/uptime") as uptime, open("/proc/self/stat") as stat:
            up = float(uptime.read().split()[0])
            # Field 22 (starttime, in clock ticks) counts after the command's ")".
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return psutil.Process().create_time()


STARTUP = StartupSplit()
