"""How each step's global batch is split: over the data-parallel ranks, then into
micro-batches of one size. The one place that derives the split (the sampler, the
step and the run's plan read it here)."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.data.sampler import micro_batches_in, split_batch


@dataclass(frozen=True)
class BatchPlan:
    """The global batch of every step and its split on `dp_size` data-parallel ranks."""

    global_batch: int
    micro: int  # samples of one micro-batch on one rank
    dp_size: int
    ramp: tuple[tuple[int, int], ...] = ()  # (from step, global batch), train.batch_ramp

    @classmethod
    def of(cls, global_batch: int, micro_batch: int, dp_size: int,
           ramp: list[tuple[int, int]] | None = None) -> BatchPlan:
        """Split `global_batch` (train.micro_batch 0: one micro-batch per rank); every
        batch of the ramp must be whole micro-batches on every rank."""
        micro, _ = split_batch(global_batch, micro_batch, dp_size)
        for _, size in ramp or []:
            if size % (micro * dp_size):
                raise ValueError(
                    f"train.batch_ramp: batch {size} is not a multiple of micro-batch "
                    f"{micro} x {dp_size} data-parallel processes; the ramp grows the "
                    "batch by accumulation, so each batch must be one")
        return cls(global_batch, micro, dp_size, tuple(ramp or ()))

    @property
    def accum(self) -> int:
        """Micro-batches a rank passes in a step of the full global batch."""
        return micro_batches_in(self.global_batch, self.micro, self.dp_size)

    def size_at(self, step: int) -> int:
        """The global batch of optimizer step `step` (the ramp's, else global_batch)."""
        size = self.global_batch
        for start, ramp_size in self.ramp:
            if step >= start:
                size = ramp_size
        return size

    def accum_at(self, step: int) -> int:
        """Micro-batches a rank passes in step `step`."""
        return micro_batches_in(self.size_at(step), self.micro, self.dp_size)

    @property
    def sizes(self) -> set[int]:
        """Every global batch the run takes."""
        return {self.global_batch, *(size for _, size in self.ramp)}
