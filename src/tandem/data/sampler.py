"""A global sample order that depends only on (seed, epoch), sliced per rank."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from tandem.runtime import derive_seed


@dataclass(kw_only=True)
class Cursor:
    """Position in the global sample stream: the epoch and the samples used of it.

    The sampler keeps its own (it runs ahead of training, into the prefetched batches);
    the trainer's, checkpointed, moves by the same `take` as each step ends.
    Because it counts samples, not steps, a resume at another world size, micro-batch
    or global batch continues at the same sample.
    """

    epoch: int = 0
    offset: int = 0

    def take(self, size: int, dataset_len: int) -> tuple[int, int]:
        """Advance by one global batch of `size`; return the (epoch, start) it came from.

        A tail shorter than a whole batch is dropped: every step sees exactly
        `size` samples, so every rank gets an equal share and none waits on another.
        """
        if self.offset + size > dataset_len:
            self.epoch += 1
            self.offset = 0
        start = self.offset
        self.offset += size
        return self.epoch, start

    def state_dict(self) -> dict[str, int]:
        """The position as JSON-ready values."""
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_state(cls, state: dict[str, int]) -> Cursor:
        """Rebuild a cursor from `state_dict()` output."""
        return cls(epoch=int(state["epoch"]), offset=int(state["offset"]))


def epoch_order(seed: int, epoch: int, dataset_len: int) -> torch.Tensor:
    """The global permutation of sample indices for one epoch."""
    generator = torch.Generator().manual_seed(derive_seed("order", seed, epoch))
    return torch.randperm(dataset_len, generator=generator)


def rank_slice(global_batch: int, rank: int, world_size: int) -> slice:
    """The part of a global batch that belongs to one rank."""
    share = global_batch // world_size
    return slice(rank * share, (rank + 1) * share)


class GlobalBatchSampler:
    """Yields this rank's micro-batches of sample indices, step after step, forever.

    Global batch t of the run is the same list of samples at every world size; rank r
    takes the r-th equal slice of it and splits that into `accum` micro-batches.
    With `batch_at` (a batch-size ramp), step s's global batch is `batch_at(s)`, split
    into micro-batches of the same size as the full batch's, so a smaller batch has
    fewer of them; `step` is the step the iteration starts at. `order(seed, epoch)`, when
    given, is the epoch's sample numbers in stream order instead of a permutation (a
    mixture's: `MixedDataset.epoch_order`); it too must depend on nothing else.
    """

    def __init__(
        self,
        *,
        dataset_len: int,
        global_batch: int,
        accum: int,
        rank: int,
        world_size: int,
        seed: int,
        cursor: Cursor,
        batch_at: Callable[[int], int] | None = None,
        step: int = 0,
        order: Callable[[int, int], torch.Tensor] | None = None,
    ) -> None:
        check_sizes(dataset_len, global_batch, world_size * accum)
        self.batch_at = batch_at
        self.step = step
        self.dataset_len = dataset_len
        self.global_batch = global_batch
        self.accum = accum
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.order = order
        self.cursor = Cursor(epoch=cursor.epoch, offset=cursor.offset)
        self._order: tuple[int, torch.Tensor] | None = None

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        if self._order is None or self._order[0] != epoch:
            order = (self.order(self.seed, epoch) if self.order is not None
                     else epoch_order(self.seed, epoch, self.dataset_len))
            self._order = (epoch, order)
        return self._order[1]

    def __iter__(self) -> Iterator[list[int]]:
        micro = self.global_batch // (self.world_size * self.accum)
        while True:
            size = self.global_batch if self.batch_at is None else self.batch_at(self.step)
            self.step += 1
            epoch, start = self.cursor.take(size, self.dataset_len)
            batch = self._epoch_order(epoch)[start : start + size]
            mine = batch[rank_slice(size, self.rank, self.world_size)].tolist()
            for k in range(micro_batches_in(size, micro, self.world_size)):
                yield mine[k * micro : (k + 1) * micro]


def check_sizes(dataset_len: int, global_batch: int, parts: int) -> None:
    """Raise ValueError unless the dataset and the batch split make sense."""
    if dataset_len == 0:
        raise ValueError("the training dataset is empty (len == 0)")
    if dataset_len < global_batch:
        raise ValueError(
            f"train.global_batch: {global_batch} is larger than the training dataset "
            f"({dataset_len} samples); use a global batch <= {dataset_len}"
        )
    if global_batch % parts:
        raise ValueError(
            f"train.global_batch: {global_batch} is not divisible by world size x "
            f"accumulation steps ({parts})"
        )


def eval_shard(dataset_len: int, rank: int, world_size: int) -> range:
    """Contiguous, disjoint evaluation indices of one rank; together they cover all."""
    return range(rank * dataset_len // world_size, (rank + 1) * dataset_len // world_size)


def micro_batches_in(size: int, micro: int, world_size: int) -> int:
    """Micro-batches of `micro` samples each of `world_size` ranks passes in a global
    batch of `size`."""
    return size // (world_size * micro)


def split_batch(global_batch: int, micro_batch: int, world_size: int) -> tuple[int, int]:
    """Derive (micro-batch per rank, accumulation steps) from the global-batch contract."""
    if global_batch % world_size:
        raise ValueError(
            f"train.global_batch: {global_batch} is not divisible by the world size "
            f"({world_size}); choose a multiple of {world_size}"
        )
    per_rank = global_batch // world_size
    micro = micro_batch or per_rank
    if micro > per_rank or per_rank % micro:
        raise ValueError(
            f"train.micro_batch: {micro} must divide the per-rank batch "
            f"(global_batch {global_batch} / world size {world_size} = {per_rank})"
        )
    return micro, per_rank // micro
