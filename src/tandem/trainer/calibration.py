"""The run's one-time measurements, taken on its last micro-batch with no trace left,
and taken again (the link's part) when the step time drifts from where they were made.
A step's FLOP count and the CPU's peak are kept between runs (`monitor.flops`): a later
run of the same step on the same machine reads them.

A drift is the median step time of the last DRIFT_WINDOWS logging windows moving more
than DRIFT from the median of the first DRIFT_WINDOWS after the measurement: one slow
window on a shared machine is not a drift (judged window by window, a busy host's noise
alone would have the link re-measured again and again). And re-measuring
never takes the calibration's total cost over RELINK_SHARE of the run's wall time.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque

import torch
import torch.distributed as dist

from tandem.monitor.calibrate import calibrate, link_cost
from tandem.monitor.catalogue import COMM_ALLREDUCE_RATE, TIME_CALIBRATION
from tandem.monitor.flops import step_signature
from tandem.monitor.system import state_bytes
from tandem.trainer.forward import forward_loss
from tandem.trainer.progress import Reporter
from tandem.trainer.step import StepParts

log = logging.getLogger("tandem")

DRIFT = 0.15  # a step time this far from the calibrated one measures the link again
DRIFT_WINDOWS = 5  # windows whose median step time is compared
RELINK_SHARE = 0.005  # the most of the run's wall time that calibration may take


class DriftWatch:
    """Whether the step time moved: the median of the last `windows` window step times
    against the median of the first `windows` after the last reset."""

    def __init__(self, windows: int = DRIFT_WINDOWS, drift: float = DRIFT) -> None:
        self.windows, self.drift = windows, drift
        self.reference: float | None = None
        self.recent: deque[float] = deque(maxlen=windows)

    def reset(self) -> None:
        """Start again: the next `windows` windows set the reference."""
        self.reference = None
        self.recent.clear()

    def update(self, step_s: float) -> bool:
        """Feed one window's step time; True when the recent median has drifted."""
        self.recent.append(step_s)
        if len(self.recent) < self.windows:
            return False
        now = statistics.median(self.recent)
        if self.reference is None:
            self.reference = now
            return False
        return abs(now / self.reference - 1.0) > self.drift


def added_to_run(seconds: float, device: torch.device) -> float:
    """What a measurement that took this rank `seconds` added to the run's wall time: the
    least over the ranks. All ranks. Ranks reach the measurement at different times (the
    slower one's step ends later) and the early ones wait for the last at its first
    collective, a wait the next step's gradient all-reduce would have held them for
    anyway; the last rank to arrive waits for no one, and the measurement ends on a
    collective, so the last rank's time is what the run lost."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return seconds
    least = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return float(least.item())


class Calibration:
    """FLOPs, peak and the link's cost of one run; re-measures the link on drift."""

    def __init__(self, parts: StepParts) -> None:
        self.p = parts
        self.watch = DriftWatch()
        self.started = time.perf_counter()
        self.grad_bytes = sum(q.numel() * q.element_size() for q in parts.params)
        self.seconds = 0.0  # what every measurement so far added to the run's wall time
        self.parts: dict[str, float] = {}  # this rank's seconds per part (`calibrate`)
        # The link measured is the one the gradients take.
        host = parts.strategy.shared_memory()
        self.all_reduce = host.all_reduce if host is not None else dist.all_reduce

    def run(self, batch: object, accum: int, step: int, reporter: Reporter) -> None:
        """Measure FLOPs, peak and the link on `batch` (the last micro-batch). All ranks.

        The one pass changes nothing the run keeps: no optimizer step, gradients cleared,
        module buffers put back, and the strategy's own memory (a comm hook's error
        feedback) restored.
        """
        p = self.p
        started = time.perf_counter()
        model, task, strategy = p.model, p.task, p.strategy
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}

        def loss_of(batch: object) -> torch.Tensor:
            with p.precision.autocast():
                return forward_loss(task, model, batch)[1]

        passes = accum if strategy.whole_step_passes else 1  # micro-batches in one pass

        def one_pass(sync: bool) -> None:
            strategy.forward_backward([batch] * passes, loss_of, sync=sync)
            p.optimizer.zero_grad(set_to_none=True)

        signature = step_signature(
            model, batch, (task.loss, task.forward, type(task)),
            f"{p.config.precision!r}|{p.config.plan!r}|{p.device.type}|{type(strategy)}")
        try:
            with strategy.calibrating(one_pass):
                figures = calibrate(one_pass, device=p.device,
                                    world_size=p.batches.dp_size, accum=accum // passes,
                                    grad_bytes=self.grad_bytes,
                                    precision=p.config.precision.mode,
                                    communicates=p.batches.dp_size > 1,
                                    signature=signature,
                                    all_reduce=self.all_reduce, spent=self.parts)
        finally:
            with torch.no_grad():
                for name, value in model.named_buffers():
                    value.copy_(buffers[name])
        figures.update(state_bytes(model, p.optimizer))
        p.monitor.static.update(figures)
        self.seconds += added_to_run(time.perf_counter() - started, p.device)
        reporter.record(step, {**figures, TIME_CALIBRATION: self.seconds})

    def drifted(self, step_s: float) -> bool:
        """Whether the step time (rank 0's view, one window's) has drifted from where the
        link was measured (`DriftWatch`) and a new measurement keeps calibration within
        RELINK_SHARE of the run's wall time so far."""
        if COMM_ALLREDUCE_RATE not in self.p.monitor.static:
            return False
        if not self.watch.update(step_s):
            return False
        return self.seconds <= RELINK_SHARE * (time.perf_counter() - self.started)

    def relink(self, step: int, reporter: Reporter) -> None:
        """Measure the link's cost again (the ranks agreed to). All ranks."""
        started = time.perf_counter()
        figures = link_cost(self.grad_bytes, self.p.device, all_reduce=self.all_reduce)
        self.p.monitor.static.update(figures)
        self.seconds += added_to_run(time.perf_counter() - started, self.p.device)
        reporter.record(step, {**figures, TIME_CALIBRATION: self.seconds})
        reporter.event(step, "recalibrated",
                       f"the step time of the last {self.watch.windows} windows drifted more "
                       f"than {DRIFT:.0%} from where the link's cost was measured: measured "
                       "again")
        self.watch.reset()
