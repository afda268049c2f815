"""The model's forward and the task's loss: written once, for training, calibration,
the preflight check and evaluation."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tandem.task import Task


def outputs_of(task: Task, model: nn.Module, batch: Any, views: bool = False) -> Any:
    """The model's outputs on `batch`; with `views` and `Task.eval_views`, their mean over
    the views the task makes of the batch (test-time augmentation)."""
    if not views or task.eval_views is None:
        return task.run_forward(model, batch)
    made = list(task.eval_views(batch))
    if not made:
        raise ValueError("Task.eval_views returned no view of the batch")
    outputs = [task.run_forward(model, view) for view in made]
    if not all(isinstance(o, torch.Tensor) and o.shape == outputs[0].shape for o in outputs):
        raise ValueError("Task.eval_views: the model's outputs on the views must be tensors "
                         "of one shape to be averaged; got "
                         f"{[getattr(o, 'shape', type(o).__name__) for o in outputs]}")
    return torch.stack(outputs).mean(0)


def forward_loss(task: Task, model: nn.Module, batch: Any,
                 views: bool = False) -> tuple[Any, torch.Tensor]:
    """(the model's outputs on `batch`, the task's loss of them)."""
    outputs = outputs_of(task, model, batch, views)
    return outputs, task.loss(outputs, batch)
