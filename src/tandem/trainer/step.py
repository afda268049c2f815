"""One optimizer step: the strategy's forward/backward over the step's micro-batches,
the components' hooks, the update."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tandem.clocks import mark
from tandem.components import Chain
from tandem.config import Config
from tandem.data.batches import BatchPlan
from tandem.errors import UsageError
from tandem.monitor.live import LiveMonitor
from tandem.parallel.strategy import Strategy
from tandem.task import Task
from tandem.trainer.forward import forward_loss
from tandem.trainer.precision import Precision


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
    batches: BatchPlan
    device: torch.device
    components: Chain


class Drawn:
    """The step's micro-batches, drawn from the loader one at a time as they are used."""

    def __init__(self, runner: StepRunner, batches: Iterator[Any], count: int,
                 step: int) -> None:
        self.runner, self.batches, self.count, self.step = runner, batches, count, step

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.count):
            yield self.runner.draw(self.batches, self.step)


class StepRunner:
    """Runs optimizer steps; the same sequence under every strategy."""

    def __init__(self, parts: StepParts) -> None:
        self.p = parts
        self.last_batch: Any = None  # the last micro-batch (calibration reuses it)
        # fp16 leaves non-finite gradients to its loss scaler, for which they are routine.
        self.guard_nonfinite = parts.config.precision.mode != "fp16"
        self.on_device = parts.device.type == "cuda" and parts.config.monitor.timing

    def loss_of(self, batch: Any) -> torch.Tensor:
        """One micro-batch's training loss: forward, the task's loss, the components'."""
        p, clock = self.p, self.p.monitor.clock
        clock.begin("forward", on_device=True)
        with p.precision.autocast():
            outputs, loss = forward_loss(p.task, p.model, batch)
            loss = p.components.loss(loss, outputs, batch)
        clock.end()
        if not loss.requires_grad:  # the same on every rank: a usage error
            raise UsageError("Task.loss returned a value that does not depend on "
                             "the model's parameters (no gradient can flow to them)")
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a (scaled) micro-batch loss, timed."""
        clock = self.p.monitor.clock
        clock.begin("backward", on_device=True)
        self.p.precision.backward(loss)
        clock.end()

    def run(self, batches: Iterator[Any],
            step: int) -> tuple[torch.Tensor, torch.Tensor, bool, int]:
        """Optimizer step `step` (steps done so far) over its global batch.

        Returns (mean micro-batch loss, gradient norm, whether the update was skipped
        because the gradients were not finite, the number of micro-batches).
        """
        p = self.p
        precision, strategy, clock = p.precision, p.strategy, p.monitor.clock
        size, accum = p.batches.size_at(step), p.batches.accum_at(step)
        p.components.before_step(step)
        # Once per window: this rank's own gradient too, for the gradient noise scale.
        probe = p.config.monitor.timing and p.monitor.wants_update_ratio(step)
        total = strategy.forward_backward(Drawn(self, batches, accum, step), self.loss_of,
                                          self.backward, probe=probe)
        for phase, seconds in strategy.take_phase_seconds().items():
            clock.add(phase, seconds)
        # How long backward waited after this rank's last gradient was ready: the
        # all-reduce it could not hide, and the wait for slower ranks.
        clock.interval("comm_tail", strategy.take_comm_mark(), mark(self.on_device))
        clock.begin("comm", on_device=True)
        strategy.after_backward()
        clock.end()
        p.components.at("optim", step)
        local_sq = strategy.take_local_grad_sq() if probe else None
        # fp16: the probe saw gradients at this scale (read only then: it syncs the device)
        scale = precision.loss_scale if local_sq is not None else 1.0
        norm, skip = self._update(step)
        if local_sq is not None and not skip:
            p.monitor.gradient_sizes(local_sq / scale**2, norm.detach().double() ** 2,
                                     size // p.batches.dp_size, size)
        return total / accum, norm, skip, accum

    def draw(self, batches: Iterator[Any], step: int) -> Any:
        """The next micro-batch from the loader, timed as data wait."""
        components, clock = self.p.components, self.p.monitor.clock
        components.at("data", step)
        clock.begin("data")
        batch = self._next_batch(batches, step)
        clock.end()
        self.last_batch = batch
        components.at("compute", step)
        return batch

    def _update(self, step: int) -> tuple[torch.Tensor, bool]:
        p = self.p
        precision, clock = p.precision, p.monitor.clock
        clock.begin("optim", on_device=True)
        with p.strategy.optimizer_context():
            norm = precision.grad_norm(p.optimizer, p.params, p.config.train.grad_clip,
                                       p.strategy.grad_norm)
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
    def _next_batch(batches: Iterator[Any], step: int) -> Any:
        try:
            return next(batches)
        except Exception as err:
            # A dead DataLoader worker surfaces as any of several errors, depending on
            # timing; a dataset that raises on one sample as its own error.
            raise RuntimeError(f"loading the batch of step {step} failed "
                               f"({type(err).__name__}: {err}); the last committed "
                               f"checkpoint is intact") from err
