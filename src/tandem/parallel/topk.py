"""Top-k gradient sparsification with error feedback, as a DDP communication hook.

Each rank sends only the k largest-magnitude entries of (gradient + residual) of a
bucket, as (value, index) pairs gathered from all ranks; what it did not send stays in
its residual and is added to the next step's gradient, so no gradient is lost, only
delayed (Stich et al. 2018; Lin et al. 2018, "Deep Gradient Compression").
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with the real `dist.GradBucket` and `Future[Tensor]` types, and string
# annotations fail that check.

import logging
import math

import torch
import torch.distributed as dist

log = logging.getLogger("tandem")

# torch 2.13 renamed all_gather_into_tensor (now deprecated); older torch lacks the new name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

INDEX_BYTES = 4  # indices travel as int32 when the bucket has fewer than 2**31 elements


class TopKState:
    """Settings and per-bucket residuals of the top-k hook (the hook's `state`)."""

    def __init__(self, ratio: float, process_group: dist.ProcessGroup | None = None) -> None:
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"topk ratio: {ratio!r} is out of range; expected a number in (0, 1]")
        self.ratio = ratio
        self.process_group = process_group
        # Keyed by bucket index: DDP calls the hook for the same buckets in the same
        # order every step (after its one rebuild of the buckets at the first step).
        self.residuals: dict[int, torch.Tensor] = {}

    def k(self, numel: int) -> int:
        """Entries each rank sends for a bucket of `numel` elements (at least 1)."""
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def payload_bytes(self, numel: int, dtype: torch.dtype) -> int:
        """Bytes one rank contributes for such a bucket: k values and k indices."""
        index_bytes = INDEX_BYTES if numel < 2**31 else 8
        return self.k(numel) * (torch.empty((), dtype=dtype).element_size() + index_bytes)


def _memory(state: TopKState, bucket: dist.GradBucket) -> torch.Tensor:
    """This bucket's gradient plus its residual, in the residual's storage."""
    buffer = bucket.buffer()
    residual = state.residuals.get(bucket.index())
    if residual is None or residual.shape != buffer.shape or residual.dtype != buffer.dtype:
        # First use, or DDP rebuilt its buckets after the first step: the old residual
        # belongs to other parameters, so start again from none (a one-time loss).
        if residual is not None:
            log.debug("topk: bucket %d changed size; its residual restarts", bucket.index())
        residual = buffer.detach().clone()
    else:
        residual.add_(buffer)
    state.residuals[bucket.index()] = residual
    return residual


def topk_hook(state: TopKState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over ranks from each rank's top-k entries.

    The result is dense: the sum of all ranks' sent entries (scatter-added, entries
    picked by several ranks add up) divided by the world size, as DDP expects.
    """
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    numel, k = buffer.numel(), state.k(buffer.numel())
    memory = _memory(state, bucket)
    index = memory.abs().topk(k, sorted=False).indices
    values = memory[index]
    memory.index_fill_(0, index, 0)  # the unsent remainder is the new residual
    # An overflowed step (fp16 loss scaling) is skipped by the optimizer, but an inf or
    # NaN kept in the residual would poison every later step; drop it, without a sync.
    memory.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    index_dtype = torch.int32 if numel < 2**31 else torch.int64
    # One collective instead of two: values and indices travel as raw bytes.
    payload = torch.cat([values.view(torch.uint8), index.to(index_dtype).view(torch.uint8)])
    gathered = torch.empty(world * payload.numel(), dtype=torch.uint8, device=buffer.device)
    work = _all_gather(gathered, payload, group=group, async_op=True)
    split = k * values.element_size()

    def densify(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()  # re-raises a failed collective
        rows = gathered.view(world, -1)
        all_values = rows[:, :split].contiguous().view(buffer.dtype)
        all_index = rows[:, split:].contiguous().view(index_dtype).long()
        buffer.zero_()
        # One index_add_ per rank: a rank's indices are distinct, so each call is free of
        # colliding atomic adds on GPUs, and the fixed rank order makes every rank's sum
        # bit-identical, which keeps the DDP replicas equal.
        for r in range(world):
            buffer.index_add_(0, all_index[r], all_values[r])
        return buffer.div_(world)

    return work.get_future().then(densify)
