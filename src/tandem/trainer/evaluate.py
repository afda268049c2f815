"""Evaluation over the whole eval set, sharded across ranks, reduced without double counting."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from tandem.config import DataConfig
from tandem.data.loader import batch_size, eval_batches
from tandem.data.sampler import eval_shard
from tandem.parallel.tensor import Layout
from tandem.runtime import Runtime
from tandem.task import Task
from tandem.trainer.forward import forward_loss
from tandem.trainer.precision import Precision


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
    over `Task.eval_views` (when the task gives it). Must be called on all processes.
    """
    names = ["loss", *task.metrics]
    totals = torch.zeros(len(names) + 1, dtype=torch.float64, device=runtime.device)
    rank, size, group = ((layout.dp_rank, layout.dp_size, layout.dp_group) if layout is not None
                         else (runtime.rank, runtime.world_size, None))
    indices = eval_shard(len(dataset), rank, size)  # type: ignore[arg-type]
    was_training = model.training
    model.eval()
    try:
        for item in eval_batches(dataset, indices, batch, data_cfg, runtime.device):
            with precision.autocast():
                outputs, loss = forward_loss(task, model, item, views)
                values = [loss, *(fn(outputs, item) for fn in task.metrics.values())]
            n = batch_size(item)
            for i, value in enumerate(values):
                totals[i] += torch.as_tensor(value, dtype=torch.float64) * n
            totals[-1] += n
    finally:
        model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(totals, group=group)
    count = totals[-1].item()
    if count == 0:
        raise ValueError("the evaluation dataset is empty (len == 0)")
    return {name: totals[i].item() / count for i, name in enumerate(names)}
