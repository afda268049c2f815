"""Evaluation over the whole eval set, sharded across ranks, reduced without double counting."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from tandem.config import DataConfig
from tandem.data.loader import batch_size, collate_of, eval_batches
from tandem.data.sampler import eval_shard
from tandem.parallel.tensor import Layout
from tandem.runtime import Runtime
from tandem.task import Task
from tandem.trainer.forward import outputs_of
from tandem.trainer.precision import Precision


class EvaluationError(ValueError):
    """An evaluation failed on one or more ranks. Raised on every rank alike (they agreed
    on it with one reduction), so the run can commit its training and stop cleanly."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks  # the ranks that failed, lowest first (its message is this one)

    def committed(self, step: int, path: str | None) -> EvaluationError:
        """The same error, saying where the training before it is kept."""
        kept = (f"training reached step {step} and its checkpoint is committed ({path}); "
                f"fix it and run the same command again: it goes on from step {step} "
                "without training it again" if path else
                f"training reached step {step}, and its checkpoint could not be committed")
        return EvaluationError(f"evaluation at step {step} failed: {self}; {kept}", self.ranks)


def _scalar(value: Any, what: str, n: int) -> torch.Tensor:
    """`value` as a float64 scalar, or a ValueError naming `what` and what it returned."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64)
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{what} returned a {type(value).__name__} on an evaluation batch; "
                         "it must return a scalar tensor or a number (the mean over the batch)")
    if value.numel() != 1:
        raise ValueError(f"{what} returned a tensor of shape {list(value.shape)} on an "
                         f"evaluation batch of {n} samples; it must return a scalar (shape "
                         "[]), the mean over the batch")
    return value.detach().to(torch.float64).reshape(())


def _call(what: str, fn: Any) -> Any:
    try:
        return fn()
    except Exception as err:
        raise ValueError(f"{what} raised {type(err).__name__}: {err}") from err


def _scores(task: Task, model: nn.Module, item: Any, views: bool, n: int) -> list[torch.Tensor]:
    """The loss and every metric on one batch, each checked to be one number."""
    outputs = _call("the model's forward on an evaluation batch",
                    lambda: outputs_of(task, model, item, views))
    fns = {"Task.loss": task.loss,
           **{f"Task.metrics[{name!r}]": fn for name, fn in task.metrics.items()}}
    return [_scalar(_call(what, lambda fn=fn: fn(outputs, item)), what, n)
            for what, fn in fns.items()]


def _agree(problem: str | None, failed: float, group: Any) -> None:
    """Raise EvaluationError on every rank if any rank failed (`failed`: the reduced count)."""
    if not failed:
        return
    found = [problem]
    if dist.is_initialized():
        found = [None] * dist.get_world_size(group)
        dist.all_gather_object(found, problem, group=group)
    ranks = [rank for rank, p in enumerate(found) if p]
    where = f" (rank {ranks[0]})" if dist.is_initialized() else ""
    raise EvaluationError(f"{found[ranks[0]]}{where}", ranks)


@torch.no_grad()
def evaluate(task: Task, model: nn.Module, dataset: Dataset, runtime: Runtime, batch: int,
             data_cfg: DataConfig, precision: Precision,
             layout: Layout | None = None, views: bool = True) -> dict[str, float]:
    """Loss and metrics over `dataset`, each a sample-weighted mean over all ranks.

    Each rank evaluates a disjoint contiguous shard; sums and counts are all-reduced
    once at the end, so the result equals one process evaluating the whole set.
    Under tensor parallelism (`layout`) the shards go to the data-parallel ranks and the
    sums are reduced over the data-parallel group: tensor-parallel peers evaluate the
    same samples together and are counted once. With `views`, the outputs are averaged
    over `Task.eval_views` (when the task gives it). A failure of the task's code (the
    forward, the loss, a metric that does not return one number) stops this rank's
    evaluation and is agreed on in the same reduction: every rank raises the same
    EvaluationError, naming the part and the first rank that failed. Must be called on
    all processes.
    """
    names = ["loss", *task.metrics]
    # The sums, the sample count, and the count of ranks whose evaluation failed.
    totals = torch.zeros(len(names) + 2, dtype=torch.float64, device=runtime.device)
    rank, size, group = ((layout.dp_rank, layout.dp_size, layout.dp_group) if layout is not None
                         else (runtime.rank, runtime.world_size, None))
    indices = eval_shard(len(dataset), rank, size)  # type: ignore[arg-type]
    was_training = model.training
    model.eval()
    problem = None
    try:
        for item in eval_batches(dataset, indices, batch, data_cfg, runtime.device,
                                 collate_of(dataset, task.collate)):
            n = batch_size(item)
            with precision.autocast():
                values = _scores(task, model, item, views, n)
            for i, value in enumerate(values):
                totals[i] += value.to(totals.device) * n
            totals[-2] += n
    except Exception as err:  # noqa: BLE001 - the user's code: agreed on, then raised
        problem = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        totals[-1] = 1
    finally:
        model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(totals, group=group)
    _agree(problem, totals[-1].item(), group)
    count = totals[-2].item()
    if count == 0:
        raise ValueError("the evaluation dataset is empty (len == 0)")
    return {name: totals[i].item() / count for i, name in enumerate(names)}
