"""The run's one-time measurements, taken on its last micro-batch with no trace left,
and taken again (the link's part) when the step time drifts from where they were made."""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from tandem.monitor.calibrate import calibrate, link_cost
from tandem.monitor.progress import Reporter
from tandem.monitor.system import state_bytes
from tandem.trainer.step import StepParts

log = logging.getLogger("tandem")

DRIFT = 0.15  # a step time this far from the calibrated one measures the link again


class Calibration:
    """FLOPs, peak and the link's cost of one run; re-measures the link on drift."""

    def __init__(self, parts: StepParts) -> None:
        self.p = parts
        self.step_s: float | None = None  # the window step time at the last measurement
        self.grad_bytes = sum(q.numel() * q.element_size() for q in parts.params)
        self.seconds = 0.0  # what every measurement so far cost this rank, in wall time

    def run(self, batch: object, accum: int, reporter: Reporter) -> None:
        """Measure FLOPs, peak and the link on `batch` (the last micro-batch). All ranks.

        The one pass changes nothing the run keeps: no optimizer step, gradients cleared,
        module buffers put back, and the strategy's own memory (a comm hook's error
        feedback) restored.
        """
        p = self.p
        started = time.perf_counter()
        model, task, strategy = p.model, p.task, p.strategy
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}

        def one_pass(sync: bool) -> None:
            context = contextlib.nullcontext() if sync else strategy.no_sync()
            with context:
                with p.precision.autocast():
                    loss = task.loss(task.run_forward(model, batch), batch)
                loss.backward()
            p.optimizer.zero_grad(set_to_none=True)

        try:
            with strategy.calibrating(one_pass):
                figures = calibrate(one_pass, device=p.device,
                                    world_size=p.layout.dp_size, accum=accum,
                                    grad_bytes=self.grad_bytes,
                                    precision=p.config.precision.mode,
                                    communicates=p.layout.dp_size > 1)
        finally:
            with torch.no_grad():
                for name, value in model.named_buffers():
                    value.copy_(buffers[name])
        figures.update(state_bytes(model, p.optimizer))
        p.monitor.static.update(figures)
        self.seconds += time.perf_counter() - started
        reporter.record(p.state.step, {**figures, "time/calibration_s": self.seconds})

    def drifted(self, step_s: float) -> bool:
        """Whether the window's step time (rank 0's view) is DRIFT away from the one the
        link was measured at; the first window after a measurement sets the reference."""
        if "comm/allreduce_bytes_per_s" not in self.p.monitor.static:
            return False
        if self.step_s is None:
            self.step_s = step_s
            return False
        return abs(step_s / self.step_s - 1.0) > DRIFT

    def relink(self, reporter: Reporter) -> None:
        """Measure the link's cost again (the ranks agreed to). All ranks."""
        started = time.perf_counter()
        figures = link_cost(self.grad_bytes, self.p.device)
        self.p.monitor.static.update(figures)
        self.seconds += time.perf_counter() - started
        reporter.record(self.p.state.step, {**figures, "time/calibration_s": self.seconds})
        reporter.event(self.p.state.step, "recalibrated",
                       "the step time drifted more than 15% from where the link's cost was "
                       "measured: measured again")
        self.step_s = None
