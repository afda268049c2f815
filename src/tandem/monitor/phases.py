"""Where a step's time goes, per phase, without stalling the device.

On CPU a phase is a wall-clock interval. On CUDA a phase is a pair of events on the
current stream; the events are read only when a logging window closes (right after
the loss has been synchronised anyway), so timing adds no per-step synchronisation.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from tandem.clocks import Mark

# h2d is the host-to-device copy on the critical path. tandem copies batches one step
# ahead on a side CUDA stream (data/loader.py), so in its own loop this stays 0; the
# phase exists for the report's breakdown and for paths that copy synchronously.
# comm is communication on the step's critical path outside backward (the data-parallel
# all-reduce of tensor parallelism, a local-SGD meeting); comm_tail is the part of
# backward after this rank's last gradient was ready, waiting for DDP's all-reduce (a
# part of backward, kept apart: wire time the backward could not hide, and the wait for
# slower ranks).
PHASES = ("data", "h2d", "forward", "backward", "comm", "optim", "comm_tail")


class PhaseClock:
    """Accumulates per-phase seconds over a logging window."""

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.enabled = enabled
        self.cuda = device.type == "cuda" and enabled
        self.host: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._open: tuple[str, float, object] | None = None

    def begin(self, phase: str, on_device: bool = False) -> None:
        """Start timing `phase` (device-side on CUDA when `on_device`)."""
        if not self.enabled:
            return
        if self.cuda and on_device:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open = (phase, 0.0, event)
        else:
            self._open = (phase, time.perf_counter(), None)

    def end(self) -> None:
        """Stop timing the open phase."""
        if not self.enabled or self._open is None:
            return
        phase, started, event = self._open
        self._open = None
        if event is None:
            self.host[phase] += time.perf_counter() - started
            return
        stop = torch.cuda.Event(enable_timing=True)
        stop.record()
        self._pending.append((phase, event, stop))  # type: ignore[arg-type]

    def add(self, phase: str, seconds: float) -> None:
        """Add seconds timed elsewhere (host clock) to `phase`."""
        if self.enabled:
            self.host[phase] += seconds

    def interval(self, phase: str, start: Mark | None, stop: Mark) -> None:
        """Add the time from `start` to `stop` (made by `mark`, in any thread) to `phase`."""
        if not self.enabled or start is None:
            return
        if isinstance(start, float) and isinstance(stop, float):
            self.host[phase] += max(0.0, stop - start)
        elif not isinstance(start, float) and not isinstance(stop, float):
            self._pending.append((phase, start, stop))

    def collect(self) -> dict[str, float]:
        """Seconds per phase since the last collect (synchronises CUDA events once)."""
        totals = dict(self.host)
        if self._pending:
            self._pending[-1][2].synchronize()
            for phase, start, stop in self._pending:
                totals[phase] = totals.get(phase, 0.0) + start.elapsed_time(stop) / 1000.0
        self.host.clear()
        self._pending.clear()
        return {phase: totals.get(phase, 0.0) for phase in PHASES}
