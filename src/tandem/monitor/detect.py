"""Training-health detectors: each turns a series into events with value and threshold.

| detector            | fires when                                                         |
| ------------------- | ------------------------------------------------------------------ |
| nonfinite           | a loss or gradient norm is NaN or Inf                              |
| loss_spike          | robust z-score of a loss vs the trailing window > SPIKE_Z (*)      |
| grad_explosion      | robust z-score of a grad norm vs the trailing window > GRAD_Z (**) |
| throughput_drop     | window throughput < DROP_RATIO x the median of the trailing window |
| data_stall          | data wait > STALL_FRACTION of a window's step time                 |

(*) Robust z-score = 0.6745 (x - median) / MAD over the trailing window (Iglewicz and
Hoaglin); it ignores the ordinary noise of a decreasing loss curve and fires on
outliers. An outlier must also lie TAIL_MARGIN times farther above the window's
median than the highest value the window holds: a converged model's per-batch loss is
heavy-tailed (most batches near 0, one with a misclassified sample many times the
median, which the median and MAD never see), and a value the window's own tail already
reaches is that tail, not a spike. The gradient norm of such a model has the same tail
(without the margin, many of a memorising model's ordinary steps were named), so it has
the margin too, and one more
way to fire: an explosion can grow by 1.3x a step, each step within twice the last one's
reach, so an outlier that ends RISE_STEPS rises of at least RISE_RATIO each, through
values already half-way to outliers, is named whatever the tail (the tail's draws are
independent: such a run is rare in them).
(**) As (*), or ending a run of rises (as above).
Detectors stay silent until the window holds MIN_HISTORY values.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

SPIKE_Z = 6.0
GRAD_Z = 8.0
DROP_RATIO = 0.6
STALL_FRACTION = 0.5
MIN_HISTORY = 8
WINDOW = 50
TAIL_MARGIN = 2.0
RISE_STEPS = 3
RISE_RATIO = 1.2


@dataclass(frozen=True)
class Event:
    """Something a detector saw."""

    kind: str
    step: int
    value: float
    threshold: float
    message: str


def robust_z(value: float, history: list[float]) -> float:
    """0.6745 (value - median) / MAD of `history` (0 when the MAD is 0 and value = median)."""
    return _z(value, *_center(history))


def _center(history: list[float]) -> tuple[float, float]:
    """(median, MAD) of `history`."""
    median = statistics.median(history)
    return median, statistics.median(abs(x - median) for x in history)


def _z(value: float, median: float, mad: float) -> float:
    if mad == 0:
        scale = abs(median) * 1e-3 or 1e-12  # a flat history: judge against 0.1% of it
        return 0.6745 * (value - median) / scale
    return 0.6745 * (value - median) / mad


class OutlierDetector:
    """Fires when a value is an upward outlier of its trailing window."""

    def __init__(self, kind: str, what: str, z: float, window: int = WINDOW,
                 rise_steps: int | None = None) -> None:
        self.kind, self.what, self.z, self.rise_steps = kind, what, z, rise_steps
        self.history: deque[float] = deque(maxlen=window)

    def _rising(self, value: float, history: list[float], median: float, mad: float) -> bool:
        """Whether `value` ends `rise_steps` rises of RISE_RATIO or more in a row whose
        values on the way were already half-way outliers (robust z > z / 2)."""
        if self.rise_steps is None or len(history) < self.rise_steps:
            return False
        run = [*history[-self.rise_steps:], value]
        return (all(b >= RISE_RATIO * a > 0 for a, b in zip(run, run[1:], strict=False))
                and all(_z(v, median, mad) > self.z / 2 for v in run[1:-1]))

    def update(self, step: int, value: float) -> Event | None:
        """Feed one value; return an event if it is an outlier. Every value joins the
        history (the median and MAD hardly move for one outlier), so a second value as
        high within the window is the same episode, or the tail, not another spike."""
        if not math.isfinite(value):
            return None  # the nonfinite detector reports these
        event = None
        if len(self.history) >= MIN_HISTORY:
            history = list(self.history)
            median, mad = _center(history)
            score = _z(value, median, mad)
            beyond_tail = value - median > TAIL_MARGIN * (max(history) - median)
            if score > self.z and (beyond_tail or self._rising(value, history, median, mad)):
                event = Event(self.kind, step, value, self.z,
                              f"{self.what} {value:.4g} at step {step} is an outlier "
                              f"(robust z {score:.1f} > {self.z})")
        self.history.append(value)
        return event


class HealthDetectors:
    """All detectors of one run, fed once per step or per logging window."""

    def __init__(self) -> None:
        self.loss = OutlierDetector("loss_spike", "loss", SPIKE_Z)
        self.grad = OutlierDetector("grad_explosion", "gradient norm", GRAD_Z,
                                    rise_steps=RISE_STEPS)
        self.rates: deque[float] = deque(maxlen=WINDOW)

    def step(self, step: int, loss: float, grad_norm: float | None) -> list[Event]:
        """Check one step's loss and gradient norm."""
        events = []
        for name, value in (("loss", loss), ("gradient norm", grad_norm)):
            if value is not None and not math.isfinite(value):
                events.append(Event("nonfinite", step, value, 0.0,
                                    f"{name} is {value} at step {step}"))
        for detector, value in ((self.loss, loss), (self.grad, grad_norm)):
            if value is not None and (event := detector.update(step, value)):
                events.append(event)
        return events

    def window(self, step: int, samples_per_s: float, data_fraction: float) -> list[Event]:
        """Check one logging window's throughput and data wait."""
        events = []
        if len(self.rates) >= MIN_HISTORY:
            median = statistics.median(self.rates)
            if samples_per_s < DROP_RATIO * median:
                events.append(Event("throughput_drop", step, samples_per_s, DROP_RATIO * median,
                                    f"throughput fell to {samples_per_s:,.0f} samples/s "
                                    f"(trailing median {median:,.0f})"))
        self.rates.append(samples_per_s)
        if data_fraction > STALL_FRACTION:
            events.append(Event("data_stall", step, data_fraction, STALL_FRACTION,
                                f"waiting for data took {data_fraction:.0%} of step time"))
        return events
