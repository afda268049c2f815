"""The run's one-time measurements, taken on its last micro-batch with no trace left."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

from tandem.monitor.calibrate import calibrate
from tandem.monitor.progress import Reporter
from tandem.monitor.system import state_bytes

if TYPE_CHECKING:
    from tandem.trainer.loop import Trainer


def calibrate_run(trainer: Trainer, reporter: Reporter) -> None:
    """Measure exposed communication, FLOPs and peak on the last micro-batch. All ranks.

    The passes change nothing the run keeps: no optimizer step, gradients cleared, module
    buffers put back, and the strategy's own memory (a comm hook's error feedback)
    restored.
    """
    t = trainer
    model, task, batch, strategy = t.model, t.task, t.steps.last_batch, t.strategy
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}

    def one_pass(sync: bool) -> None:
        context = contextlib.nullcontext() if sync else strategy.no_sync()
        with context:
            with t.precision.autocast():
                loss = task.loss(task.run_forward(model, batch), batch)
            loss.backward()
        t.optimizer.zero_grad(set_to_none=True)

    try:
        with strategy.calibrating(one_pass):
            figures = calibrate(one_pass, device=t.runtime.device,
                                world_size=t.runtime.world_size, accum=t.accum,
                                grad_bytes=sum(p.numel() * p.element_size() for p in t.params),
                                precision=t.config.precision.mode,
                                synchronised=strategy.syncs_each_backward)
    finally:
        with torch.no_grad():
            for name, value in model.named_buffers():
                value.copy_(buffers[name])
    figures.update(state_bytes(model, t.optimizer))
    t.monitor.static.update(figures)
    reporter.record(t.state.step, figures)
