"""Losses the framework may adjust: a task that leaves its cross-entropy to tandem gets
`train.label_smoothing` applied in training, and the plain loss in evaluation."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn import functional as F

from tandem.task import Task


def _targets(batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        if "target" not in batch:
            raise ValueError(f"tandem.CrossEntropy reads a dict batch's 'target'; this batch "
                             f"has keys {sorted(batch)}")
        return batch["target"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[1]
    raise ValueError("tandem.CrossEntropy reads the targets from batch[1] (or "
                     "batch['target']); this batch has no second item")


@dataclass(frozen=True)
class CrossEntropy:
    """Mean cross-entropy of logits [..., classes] against integer targets [...].

    Use it as ``Task(loss=tandem.CrossEntropy(), ...)``: the targets are ``batch[1]``
    (``batch["target"]`` for a dict batch), every position of a sequence counts once, and
    the logits are scored in float32. The run's ``train.label_smoothing`` is applied to
    the training loss (`smoothed`); evaluation scores the plain cross-entropy.
    """

    label_smoothing: float = 0.0

    def __call__(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        """The mean loss over every target of the batch."""
        targets = _targets(batch)
        return F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(),
                               label_smoothing=self.label_smoothing)

    def smoothed(self, label_smoothing: float) -> CrossEntropy:
        """The same loss with another label smoothing."""
        return CrossEntropy(label_smoothing=label_smoothing)


def training_task(task: Task, label_smoothing: float) -> Task:
    """The task as training runs it: its loss smoothed by `train.label_smoothing`.

    Raise ValueError when smoothing is asked for but the task computes its own loss.
    """
    if not label_smoothing:
        return task
    if not isinstance(task.loss, CrossEntropy):
        raise ValueError(f"train.label_smoothing: {label_smoothing!r} applies only to a task "
                         "whose loss is tandem.CrossEntropy(); this task computes its own "
                         f"loss ({getattr(task.loss, '__name__', type(task.loss).__name__)}): "
                         "smooth inside it, or set 0")
    return replace(task, loss=task.loss.smoothed(label_smoothing))
