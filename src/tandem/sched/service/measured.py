"""What a live job has measured of itself, read from the run store it writes.

Per logging window a run records `samples_per_s` (rank -1) and, when the monitor
estimates it, `grad_noise_scale` (rank -1); per resume a `resume` event, per graceful
stop a `preempted` event. The window's world size and global batch are those of the
attempt that was running at the window's time (the scheduler knows each attempt's size
and batch), so windows are attributed to attempts by time. Nothing here is live state:
it is all re-read from the store, so a restarted service knows what its predecessor knew.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.monitor.catalogue import GRAD_NOISE_SCALE, SAMPLES_PER_S
from tandem.monitor.store import RunStore
from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.throughput import StepSample, ThroughputModel
from tandem.sched.service.records import Attempt

NOISE_METRIC = GRAD_NOISE_SCALE
RATE_METRIC = SAMPLES_PER_S
NOISE_WINDOWS = 3  # the noise scale is the median of this many latest windows


@dataclass(frozen=True)
class Window:
    """One logging window: its step, time and samples/s."""

    step: int
    time: float
    rate: float


@dataclass
class Measured:
    """A job's measurements so far (all empty before its first window)."""

    run_id: str | None = None
    status: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    noise_scale: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_batch(self) -> int | None:
        """The global batch of the job's own recipe (its config's train.global_batch)."""
        value = self.config.get("train", {}).get("global_batch")
        return int(value) if value else None

    @property
    def last_step(self) -> int:
        """The latest step the store has a window or an event for."""
        steps = [w.step for w in self.windows] + [int(e["step"]) for e in self.events]
        return max(steps, default=0)

    @property
    def progress(self) -> float:
        """Steps done over the steps the run was asked for (its config's train.steps);
        0 when either is unknown. A run that stops early at its target is further along
        than this says."""
        steps = self.config.get("train", {}).get("steps")
        if not steps or int(steps) <= 0:
            return 0.0
        return min(1.0, self.last_step / int(steps))

    def latest_rate(self) -> float | None:
        """samples/s of the latest window."""
        return self.windows[-1].rate if self.windows else None

    def efficiency(self, base_batch: int) -> EfficiencyModel:
        """Statistical efficiency from the noise scale (every batch alike when unmeasured)."""
        noise = self.noise_scale if self.noise_scale is not None else math.inf
        return EfficiencyModel(noise_scale=noise, base_batch=base_batch)

    def first_event(self, kind: str, after: float) -> dict[str, Any] | None:
        """The first event of `kind` at or after wall time `after`."""
        for event in self.events:
            if event["kind"] == kind and event["time"] >= after:
                return event
        return None

    def first_window(self, after: float) -> Window | None:
        """The first window logged at or after wall time `after`."""
        return next((w for w in self.windows if w.time >= after), None)


def read(store: RunStore, run_name: str) -> Measured:
    """Everything the run store holds of the run named `run_name` (empty when none)."""
    try:
        run = store.run(run_name)
    except ValueError:
        return Measured()
    if run["name"] != run_name:
        return Measured()  # a prefix match of another run's id is not this job's run
    run_id = run["run_id"]
    rates = store.metrics(run_id, RATE_METRIC, rank=-1)
    noise = store.metrics(run_id, NOISE_METRIC, rank=-1)
    finite = [r["value"] for r in noise[-NOISE_WINDOWS:] if math.isfinite(r["value"])
              and r["value"] > 0]
    return Measured(
        run_id=run_id, status=run["status"], config=run["config"] or {},
        windows=sorted((Window(r["step"], r["time"], r["value"]) for r in rates
                        if math.isfinite(r["value"]) and r["value"] > 0),
                       key=lambda w: w.time),
        noise_scale=statistics.median(finite) if finite else None,
        events=store.events(run_id))


def attempt_rates(measured: Measured, attempts: Sequence[Attempt],
                  base_batch: int) -> dict[tuple[int, int], float]:
    """Median samples/s per (processes, global batch), windows attributed by time.

    The first window of each attempt is dropped when the attempt has more than one: it
    holds the start-up (first steps, warm caches) that later windows do not.
    """
    per_attempt: dict[int, list[float]] = {}
    for window in measured.windows:
        for attempt in attempts:
            ended = attempt.ended if attempt.ended is not None else math.inf
            if attempt.launched <= window.time <= ended:
                per_attempt.setdefault(attempt.attempt, []).append(window.rate)
                break
    grouped: dict[tuple[int, int], list[float]] = {}
    for attempt in attempts:
        rates = per_attempt.get(attempt.attempt, [])
        if len(rates) > 1:
            rates = rates[1:]
        key = (attempt.procs, attempt.batch or base_batch)
        grouped.setdefault(key, []).extend(rates)
    return {k: statistics.median(v) for k, v in grouped.items() if v}


def throughput_model(rates: dict[tuple[int, int], float],
                     slots_per_node: int) -> ThroughputModel | None:
    """The step-time model fitted to measured (processes, batch) -> samples/s, or None."""
    if not rates:
        return None
    samples = [StepSample(nodes=-(-procs // slots_per_node), procs=procs,
                          local_bsz=batch / procs, step_time=batch / rate)
               for (procs, batch), rate in sorted(rates.items())]
    return ThroughputModel.fit(samples)
