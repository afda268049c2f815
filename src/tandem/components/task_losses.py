"""Each source's training loss of a mixture, per logging window, over all ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tandem.components.base import Component, RunParts
from tandem.data.mixture import MixedBatch, Mixture
from tandem.monitor.catalogue import TASK_LOSS, TASK_SHARE, task_kind, task_metric


class TaskLosses(Component):
    """Sums each source's loss over the micro-batches of a window (detached, on the device:
    no synchronisation per step) and reduces them over the ranks when the window closes.
    A source's figure is the mean over its samples, whatever the ranks and micro-batches
    that held them; replicas that see the same samples (tensor parallelism) add to the
    sums and the counts alike, which leaves the means as they are."""

    rolls_back = False

    def __init__(self, mixture: Mixture) -> None:
        self.mixture = mixture
        self.sums: torch.Tensor | None = None  # per source: loss x samples, then samples
        self.figures: dict[str, float] = {}

    def setup(self, parts: RunParts) -> None:
        """Keep the window's sums on the run's device."""
        self.sums = torch.zeros(2, len(self.mixture.sources), dtype=torch.float64,
                                device=parts.device)

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        """Add this micro-batch's per-source losses to the window's; the loss unchanged."""
        if self.sums is None or not isinstance(batch, MixedBatch):
            return loss
        with torch.no_grad():
            for name, (value, count) in self.mixture.source_losses(outputs, batch).items():
                k = self.mixture.names.index(name)
                self.sums[0, k] += value.detach().double() * count
                self.sums[1, k] += count
        return loss

    def at(self, phase: str, step: int) -> None:
        """At a window's end (every rank): reduce the sums into the window's figures."""
        if phase != "window" or self.sums is None:
            return
        sums = self.sums.clone()
        if dist.is_initialized():
            dist.all_reduce(sums)
        self.sums.zero_()
        total = float(sums[1].sum())
        self.figures = {}
        for k, name in enumerate(self.mixture.names):
            count = float(sums[1, k])
            if count:
                self.figures[task_metric(name, task_kind(TASK_LOSS))] = float(sums[0, k]) / count
            if total:
                self.figures[task_metric(name, task_kind(TASK_SHARE))] = count / total

    def metrics(self) -> dict[str, float]:
        """The window's per-source losses and shares."""
        return self.figures


def task_losses(task: Any) -> list[Component]:
    """The per-source loss records of a task whose loss is a mixture's (`mixture.loss`)."""
    mixture = getattr(task.loss, "__self__", None)
    return [TaskLosses(mixture)] if isinstance(mixture, Mixture) else []
