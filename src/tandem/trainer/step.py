"""One optimizer step: accumulation micro-batches, the strategy's hooks, the update."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from tandem.clocks import mark
from tandem.config import Config
from tandem.errors import UsageError
from tandem.faults import FaultPlan
from tandem.monitor.heartbeat import Heartbeat
from tandem.monitor.live import LiveMonitor
from tandem.parallel.mesh import Layout
from tandem.parallel.strategy import Strategy
from tandem.task import Task
from tandem.trainer.precision import Precision
from tandem.trainer.state import TrainState


@dataclass
class StepParts:
    """What a step works with: the run's parts, built once by the Trainer."""

    task: Task
    config: Config
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    strategy: Strategy
    precision: Precision
    monitor: LiveMonitor
    layout: Layout
    state: TrainState
    micro: int
    device: torch.device
    heartbeat: Heartbeat
    faults: FaultPlan | None


class StepRunner:
    """Runs optimizer steps; the same sequence under every strategy."""

    def __init__(self, parts: StepParts) -> None:
        self.p = parts
        self.last_batch: Any = None  # the last micro-batch (calibration reuses it)
        # fp16 leaves non-finite gradients to its loss scaler, for which they are routine.
        self.guard_nonfinite = parts.config.precision.mode != "fp16"
        self.on_device = parts.device.type == "cuda" and parts.config.monitor.timing

    def fault(self, phase: str) -> None:
        """Act out an injected fault planned for this phase of this step, if any."""
        p = self.p
        if p.faults is not None:
            p.heartbeat.at(p.state.step, phase)
            p.faults.hit(phase, p.state.step)

    def run(self, batches: Any, size: int) -> tuple[torch.Tensor, torch.Tensor, bool, int]:
        """One optimizer step over a global batch of `size` samples.

        Returns (mean micro-batch loss, gradient norm, whether the update was skipped
        because the gradients were not finite, the number of micro-batches).
        """
        p = self.p
        precision, strategy, clock, step = p.precision, p.strategy, p.monitor.clock, p.state.step
        factor = p.faults.loss_factor(step) if p.faults is not None else None
        total = torch.zeros((), device=p.device)
        accum = size // (p.micro * p.layout.dp_size)
        # Once per window: this rank's own gradient too, for the gradient noise scale.
        probe = p.config.monitor.timing and p.monitor.wants_update_ratio(step)
        for k in range(accum):
            last = k == accum - 1
            batch = self._batch(batches, step)
            sync = contextlib.nullcontext() if last else strategy.no_sync()
            with sync:
                clock.begin("forward", on_device=True)
                with precision.autocast():
                    loss = p.task.loss(p.task.run_forward(p.model, batch), batch)
                if factor is not None:  # an injected NaN or loss spike
                    loss = loss * factor
                clock.end()
                if not loss.requires_grad:  # the same on every rank: a usage error
                    raise UsageError("Task.loss returned a value that does not depend on "
                                     "the model's parameters (no gradient can flow to them)")
                if probe and last:
                    strategy.arm_gradient_probe()
                # Mean over the micro-batch / accum, then the mean over ranks: the
                # gradient of the mean loss over the whole global batch.
                clock.begin("backward", on_device=True)
                precision.backward(loss / accum)
                clock.end()
            total += loss.detach().float()
        # How long backward waited after this rank's last gradient was ready: the
        # all-reduce it could not hide, and the wait for slower ranks.
        clock.interval("comm_tail", strategy.take_comm_mark(), mark(self.on_device))
        clock.begin("comm", on_device=True)
        strategy.after_backward()
        clock.end()
        self.fault("optim")
        local_sq = strategy.take_local_grad_sq() if probe else None
        # fp16: the probe saw gradients at this scale (read only then: it syncs the device)
        scale = precision.loss_scale if local_sq is not None else 1.0
        norm, skip = self._update(step)
        if local_sq is not None and not skip:
            p.monitor.gradient_sizes(local_sq / scale**2, norm.detach().double() ** 2,
                                     size // p.layout.dp_size, size)
        return total / accum, norm, skip, accum

    def _batch(self, batches: Any, step: int) -> Any:
        self.fault("data")
        clock = self.p.monitor.clock
        clock.begin("data")
        batch = self._next_batch(batches, step)
        clock.end()
        self.last_batch = batch
        self.fault("compute")
        return batch

    def _update(self, step: int) -> tuple[torch.Tensor, bool]:
        p = self.p
        precision, clock = p.precision, p.monitor.clock
        clock.begin("optim", on_device=True)
        with p.strategy.optimizer_context():
            norm = precision.grad_norm(p.optimizer, p.params, p.config.train.grad_clip)
            # The norm is of the reduced gradient, so every rank takes the same branch.
            skip = self.guard_nonfinite and not bool(torch.isfinite(norm))
            if not skip:
                # Once per window: how far the update moved the weights, relative to them.
                measure = p.config.monitor.timing and p.monitor.wants_update_ratio(step)
                before = p.monitor.snapshot(p.params) if measure else None
                precision.step(p.optimizer)
                if before is not None:
                    p.monitor.update_sizes(before, p.params)
        p.optimizer.zero_grad(set_to_none=True)
        clock.end()
        return norm, skip

    @staticmethod
    def _next_batch(batches: Any, step: int) -> Any:
        try:
            return next(batches)
        except Exception as err:
            # A dead DataLoader worker surfaces as any of several errors, depending on
            # timing; a dataset that raises on one sample as its own error.
            raise RuntimeError(f"loading the batch of step {step} failed "
                               f"({type(err).__name__}: {err}); the last committed "
                               f"checkpoint is intact") from err
