"""Read from a safetensors file only the part of a tensor this rank holds.

A parameter distributed as a DTensor (FSDP2's `Shard(0)`, tensor parallelism's
column-wise `Shard(0)` or row-wise `Shard(1)`, `Replicate` on any mesh axis) holds one
block of the whole tensor: its shape and offset follow from the placements and this
rank's coordinates on the mesh (`compute_local_shape_and_global_offset`, uneven shards
included, as torch.chunk splits them). That block alone is sliced out of the file
(`safe_open(...).get_slice(name)[...]`, which reads through a memory map) and copied
into the rank's local tensor, so no rank ever holds the whole of a sharded tensor. A
plain tensor (one process, DDP, a parameter no plan splits) is read whole.
"""

from __future__ import annotations

from typing import Any

import torch


def local_block(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...] | None]:
    """(the tensor this rank writes into, the slices of the whole tensor it holds); None
    for the slices of a plain tensor (all of it)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor, None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements)
    return tensor.to_local(), tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def read_into(opened: Any, key: str, target: torch.Tensor) -> int:
    """Copy this rank's block of tensor `key` of the open safetensors file into `target`
    (a plain tensor or a DTensor); returns the bytes read from the file."""
    into, block = local_block(target)
    if not block:  # a plain tensor, or a scalar
        value = opened.get_tensor(key)
    elif into.numel() == 0:  # an uneven split can leave a rank nothing
        return 0
    else:
        value = opened.get_slice(key)[block]
    with torch.no_grad():
        into.copy_(value.reshape(into.shape))
    return value.numel() * value.element_size()
