"""Checks before the first step: the task's parts and one batch, on every rank, agreed.

Each stage runs code of the user's (the factories, the loss, the metrics) with nothing
collective inside, catches what goes wrong, and ends with one all_gather of every
rank's problem: if any rank failed, every rank raises the same PreflightError (the
lowest failing rank's message), so no rank is left waiting in a collective and the
mistake is reported once, before anything is written for the run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, IterableDataset, default_collate

from tandem.errors import PreflightError
from tandem.monitor.catalogue import EVAL_LOSS
from tandem.monitor.startup import STARTUP
from tandem.task import Task
from tandem.trainer.forward import outputs_of


def agree(problem: str | None) -> None:
    """Raise PreflightError on every rank if any rank has a problem. All ranks."""
    found = [problem]
    if dist.is_initialized() and dist.get_world_size() > 1:
        found = [None] * dist.get_world_size()
        with STARTUP.part("preflight"):
            dist.all_gather_object(found, problem)
    failed = [rank for rank, p in enumerate(found) if p]
    if failed:
        raise PreflightError(str(found[failed[0]]), failed)


@contextlib.contextmanager
def stage() -> Iterator[None]:
    """Run a block of local checks; then agree with the other ranks on its outcome."""
    problem = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - any failure of the user's code is reported
        problem = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
    agree(problem)


def check_dataset(dataset: Any, field: str) -> None:
    """A map-style dataset with a length and at least one sample."""
    if isinstance(dataset, IterableDataset):
        raise ValueError(f"Task.{field} returned an IterableDataset; tandem needs a map-style "
                         "Dataset (__len__ and __getitem__) to keep one global sample order "
                         "at any process count")
    if not isinstance(dataset, Dataset) and not hasattr(dataset, "__getitem__"):
        raise ValueError(f"Task.{field} must return a torch Dataset, got "
                         f"{type(dataset).__name__}")
    try:
        size = len(dataset)
    except TypeError:
        raise ValueError(f"Task.{field} returned a {type(dataset).__name__} without a "
                         "length (__len__); tandem needs to know how many samples it "
                         "holds") from None
    if size == 0:
        raise ValueError(f"Task.{field} returned an empty dataset (len == 0)")


def check_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The optimizer factory's product must be a torch optimizer over the given params."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError("Task.optimizer must return a torch.optim.Optimizer built on the "
                         f"parameters it is given, got {type(optimizer).__name__}")
    return optimizer


def first_batch(dataset: Dataset, indices: list[int],
                collate: Callable[[list[Any]], Any] = default_collate) -> Any:
    """The samples at `indices`, collated as the DataLoader would."""
    samples = []
    for i in indices:
        try:
            samples.append(dataset[i])
        except Exception as err:
            raise ValueError(f"Task.train_data: reading sample {i} raised "
                             f"{type(err).__name__}: {err}") from err
    if collate is not default_collate:
        return _call("the collate (Task.collate or the dataset's collate_fn)",
                     lambda: collate(samples))
    try:
        return default_collate(samples)
    except (TypeError, RuntimeError) as err:
        raise ValueError(f"Task.train_data: samples cannot be batched together ({err}); "
                         "return tensors (or tuples/dicts of tensors) of equal shapes, or "
                         "give Task.collate (e.g. to pad sequences)") from err


def _call(what: str, fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:
        raise ValueError(f"{what} raised {type(err).__name__}: {err}") from err


def _scalar(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must return the mean over the batch as a scalar; it "
                             f"returned a tensor of shape {list(value.shape)}")
        return float(value.detach().float().item())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"{what} must return a scalar tensor or a number, got "
                     f"{type(value).__name__}")


def check_step(task: Task, model: nn.Module, batch: Any, autocast: Any) -> None:
    """Forward, loss and every metric on one batch, without gradients: each must give one
    number. Module buffers (normalisation statistics) are put back afterwards."""
    with STARTUP.part("preflight"):  # priced in the run's start-up split
        _check_step(task, model, batch, autocast)


def _check_step(task: Task, model: nn.Module, batch: Any, autocast: Any) -> None:
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    # A compiled module (plan.compile) would compile a separate no-grad graph for this one
    # call: run its eager forward instead (`nn.Module.compile` keeps it beside).
    compiled, model._compiled_call_impl = getattr(model, "_compiled_call_impl", None), None
    try:
        with torch.no_grad(), autocast():
            outputs = _call("the model's forward on a training batch",
                            lambda: outputs_of(task, model, batch))
            loss = _call("Task.loss", lambda: task.loss(outputs, batch))
            value = _scalar(loss, "Task.loss")
            for name, fn in task.metrics.items():
                what = f"Task.metrics[{name!r}]"
                _scalar(_call(what, lambda fn=fn: fn(outputs, batch)), what)
    finally:
        model._compiled_call_impl = compiled
        with torch.no_grad():
            for name, value_ in model.named_buffers():
                value_.copy_(buffers[name])
    if isinstance(value, float) and math.isnan(value):
        return  # a NaN loss is the run's to handle (fault.nonfinite), not a usage error


def check_target(target: tuple[str, str, float] | None, metrics: Mapping[str, Any],
                 eval_dataset: Any) -> None:
    """train.target must name something evaluation produces (the task's metrics, and a
    mixture's per-source figures)."""
    if target is None:
        return
    from tandem.trainer.evaluations import by_source

    produced = [EVAL_LOSS, *metrics, *by_source(eval_dataset)]
    if eval_dataset is None:
        raise ValueError(f"train.target: {target[0]!r} is checked at evaluations, and the "
                         "task has no eval_data; give Task.eval_data or drop train.target")
    if target[0] not in produced:
        raise ValueError(f"train.target names {target[0]!r}, which evaluation does not "
                         f"produce; it produces {produced}")
