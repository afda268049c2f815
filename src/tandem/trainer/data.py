"""The run's data: the batch split, the training task and the datasets, checked locally."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tandem.config import Config, parse_mix, parse_ramp
from tandem.data.batches import BatchPlan
from tandem.data.loader import collate_of, train_batches
from tandem.data.memory import held
from tandem.data.mixture import MixedDataset
from tandem.data.sampler import Cursor, GlobalBatchSampler, check_sizes
from tandem.data.seqlen import SeqRamp
from tandem.losses import training_task
from tandem.runtime import derive_seed, seed_all
from tandem.task import Task
from tandem.trainer import preflight


@dataclass(frozen=True)
class RunData:
    """What the run trains and evaluates on, and how each step's batch is split."""

    batches: BatchPlan
    train_task: Task  # the task with the training loss (label smoothing)
    dataset: Any
    eval_dataset: Any | None
    collate: Callable[[list[Any]], Any]  # how a micro-batch's samples become a batch
    # The epoch's sample order when the dataset gives its own (a mixture's), else None.
    order: Callable[[int, int], torch.Tensor] | None = None

    def first_ids(self, micro: int, seed: int) -> list[int]:
        """The samples of the run's first micro-batch (the preflight check's batch)."""
        if self.order is None:
            return list(range(micro))
        return self.order(seed, 0)[:micro].tolist()


def build_data(task: Task, config: Config, dp_size: int) -> RunData:
    """Split the batch, make the datasets; local checks only (no collective). Seeds the
    build first: the model factory that runs next makes the same weights on every rank
    and at every world size."""
    train = config.train
    ramp = parse_ramp(train.batch_ramp, train.global_batch) if train.batch_ramp else []
    micro = train.micro_batch
    plan = config.plan
    # A pipeline's micro-batches: plan.pp_microbatches, else train.micro_batch's, else one
    # per stage (the fewest that fill the pipeline).
    count = plan.pp_microbatches or (0 if micro else plan.pp * plan.pp_virtual)
    if plan.pp > 1 and count:
        per_rank = train.global_batch // dp_size
        if train.global_batch % dp_size or per_rank % count:
            raise ValueError(f"plan.pp_microbatches: {count} micro-batches do not divide the "
                             f"batch of each pipeline (train.global_batch "
                             f"{train.global_batch} / {dp_size} pipelines); use a divisor of "
                             f"{per_rank}")
        micro = per_rank // count
    batches = BatchPlan.of(train.global_batch, micro, dp_size, ramp)
    if config.plan.static_graph and (batches.accum > 1 or ramp):
        raise ValueError(
            f"plan.static_graph: true with {batches.accum} accumulation passes a step (or "
            "a batch ramp) fails inside DDP's reducer, which expects every parameter "
            "once per step; keep one: static_graph false, or train.micro_batch 0")
    seed_all(derive_seed("build", config.run.seed))
    train_task = training_task(task, train.label_smoothing)
    dataset = task.train_data()
    preflight.check_dataset(dataset, "train_data")
    if config.data.mix:
        dataset = _remixed(dataset, config.data.mix)
    order = None
    if isinstance(dataset, MixedDataset):
        if task.collate is not None:
            raise ValueError("Task.collate: a tandem.Mixture collates each source's samples "
                             "with its own dataset's collate_fn; leave Task.collate None and "
                             "give a source's dataset a collate_fn where it needs one")
        order = dataset.epoch_order
    collate = collate_of(dataset, task.collate)
    dataset = held(dataset, config.data, "train_data", collate)
    for size in batches.sizes:
        check_sizes(len(dataset), size, batches.micro * dp_size)
    eval_dataset = task.eval_data() if task.eval_data is not None else None
    if eval_dataset is not None:
        preflight.check_dataset(eval_dataset, "eval_data")
        if not isinstance(eval_dataset, MixedDataset):  # evaluated per source, as it is
            eval_dataset = held(eval_dataset, config.data, "eval_data",
                                collate_of(eval_dataset, task.collate))
    return RunData(batches, train_task, dataset, eval_dataset, collate, order)


def _remixed(dataset: Any, mix: str) -> MixedDataset:
    """The mixture with data.mix's shares."""
    if not isinstance(dataset, MixedDataset):
        raise ValueError(f"data.mix: {mix!r} sets the shares of a tandem.Mixture; this task's "
                         f"train_data is a {type(dataset).__name__}: leave data.mix empty")
    weights, temperature = parse_mix(mix)
    try:
        return dataset.reweighted(weights, temperature)
    except ValueError as err:
        raise ValueError(f"data.mix: {err}") from None


def micro_batches(data: RunData, config: Config, dp_rank: int, cursor: Cursor, step: int,
                  device: torch.device, now: Callable[[], int]) -> Iterator[Any]:
    """This rank's micro-batches on `device` from sample `cursor` of the global order, for
    step `step` on; `now()` is the step in progress (a sequence-length ramp reads it)."""
    plan = data.batches
    sampler = GlobalBatchSampler(
        dataset_len=len(data.dataset), global_batch=plan.global_batch, accum=plan.accum,
        rank=dp_rank, world_size=plan.dp_size, seed=config.run.seed, cursor=cursor,
        batch_at=plan.size_at if plan.ramp else None, step=step, order=data.order)
    batches = train_batches(data.dataset, sampler, config.data, device, data.collate)
    if config.train.seq_ramp:
        batches = SeqRamp(config.train.seq_ramp).apply(batches, now)
    return batches
