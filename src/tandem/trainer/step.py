"""One optimizer step: accumulation micro-batches, the strategy's hooks, the update."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from tandem.errors import UsageError

if TYPE_CHECKING:
    from tandem.trainer.loop import Trainer


class StepRunner:
    """Runs optimizer steps for a Trainer; the same sequence under every strategy."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.last_batch: Any = None  # the last micro-batch (calibration reuses it)
        # fp16 leaves non-finite gradients to its loss scaler, for which they are routine.
        self.guard_nonfinite = trainer.config.precision.mode != "fp16"

    def fault(self, phase: str) -> None:
        """Act out an injected fault planned for this phase of this step, if any."""
        t = self.t
        if t.faults is not None:
            t.heartbeat.at(t.state.step, phase)
            t.faults.hit(phase, t.state.step)

    def run(self, batches: Any, size: int) -> tuple[torch.Tensor, torch.Tensor, bool, int]:
        """One optimizer step over a global batch of `size` samples.

        Returns (mean micro-batch loss, gradient norm, whether the update was skipped
        because the gradients were not finite, the number of micro-batches).
        """
        t = self.t
        task, model, precision, strategy = t.task, t.model, t.precision, t.strategy
        clock, step = t.monitor.clock, t.state.step
        factor = t.faults.loss_factor(step) if t.faults is not None else None
        total = torch.zeros((), device=t.runtime.device)
        accum = size // (t.micro * t.layout.dp_size)
        # Once per window: this rank's own gradient too, for the gradient noise scale.
        probe = t.config.monitor.timing and t.monitor.wants_update_ratio(step)
        for k in range(accum):
            self.fault("data")
            clock.begin("data")
            batch = self._next_batch(batches, step)
            clock.end()
            self.last_batch = batch
            self.fault("compute")
            sync = strategy.no_sync() if k < accum - 1 else contextlib.nullcontext()
            with sync:
                clock.begin("forward", on_device=True)
                with precision.autocast():
                    loss = task.loss(task.run_forward(model, batch), batch)
                if factor is not None:  # an injected NaN or loss spike
                    loss = loss * factor
                clock.end()
                if not loss.requires_grad:  # the same on every rank: a usage error
                    raise UsageError("Task.loss returned a value that does not depend on "
                                     "the model's parameters (no gradient can flow to them)")
                # Mean over the micro-batch / accum, then the mean over ranks: the
                # gradient of the mean loss over the whole global batch.
                if probe and k == accum - 1:
                    strategy.arm_gradient_probe()
                clock.begin("backward", on_device=True)
                precision.backward(loss / accum)
                clock.end()
            total += loss.detach().float()
        clock.begin("backward", on_device=True)
        strategy.after_backward()
        clock.end()
        self.fault("optim")
        local_sq = strategy.take_local_grad_sq() if probe else None
        scale = precision.loss_scale  # fp16: the probe saw gradients at this scale
        norm, skip = self._update(step)
        if local_sq is not None and not skip:
            t.monitor.gradient_sizes(local_sq / scale**2, norm.detach().double() ** 2,
                                     size // t.layout.dp_size, size)
        return total / accum, norm, skip, accum

    def _update(self, step: int) -> tuple[torch.Tensor, bool]:
        t = self.t
        precision, clock = t.precision, t.monitor.clock
        clock.begin("optim", on_device=True)
        with t.strategy.optimizer_context():
            norm = precision.grad_norm(t.optimizer, t.params, t.config.train.grad_clip)
            # The norm is of the reduced gradient, so every rank takes the same branch.
            skip = self.guard_nonfinite and not bool(torch.isfinite(norm))
            if not skip:
                # Once per window: how far the update moved the weights, relative to them.
                measure = t.config.monitor.timing and t.monitor.wants_update_ratio(step)
                before = t.monitor.snapshot(t.params) if measure else None
                precision.step(t.optimizer)
                if before is not None:
                    t.monitor.update_sizes(before, t.params)
        t.optimizer.zero_grad(set_to_none=True)
        clock.end()
        return norm, skip

    @staticmethod
    def _next_batch(batches: Any, step: int) -> Any:
        try:
            return next(batches)
        except (RuntimeError, OSError, EOFError) as err:
            # A dead DataLoader worker surfaces as any of these, depending on timing.
            raise RuntimeError(f"loading the batch of step {step} failed "
                               f"({type(err).__name__}: {err}); the last committed "
                               f"checkpoint is intact") from err
