"""Fully sharded data parallelism with FSDP2 (`fully_shard`): blocks first, then the root."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

log = logging.getLogger("tandem")


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def find_blocks(model: nn.Module,
                block_types: tuple[type, ...] | None = None) -> list[nn.Module]:
    """The sub-modules to shard as units, outermost first, never nested in one another.

    With `block_types`, every module whose type is one of them (the root excluded).
    Without, the auto rule: the children of the outermost `nn.ModuleList` /
    `nn.Sequential` containers that hold more than one child (the root itself counts),
    keeping only children that own parameters. This finds the repeated layers of the
    usual models (`self.layers = nn.ModuleList([...])`, `nn.Sequential(Linear, ReLU,
    Linear)`); the search does not descend into a chosen block, so a block's own inner
    Sequential (an MLP inside a transformer layer) stays part of that block's single
    all-gather instead of splitting it into many small ones.
    """
    blocks: list[nn.Module] = []

    def visit(module: nn.Module, is_root: bool) -> None:
        if block_types is not None:
            if not is_root and isinstance(module, block_types):
                blocks.append(module)
                return
        elif isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1:
            blocks.extend(child for child in module.children() if _has_params(child))
            return
        for child in module.children():
            visit(child, False)

    visit(model, True)
    return blocks


def shard(model: nn.Module, *, reshard_after_forward: bool,
          param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None,
          block_types: tuple[type, ...] | None = None,
          mesh: DeviceMesh | None = None) -> nn.Module:
    """Shard `model`'s parameters over the data-parallel ranks with FSDP2, in place.

    Each block (see `find_blocks`) becomes its own FSDP unit, so its parameters are
    all-gathered just before its forward and freed after (`reshard_after_forward`),
    overlapping communication with the neighbouring blocks' compute; the root unit holds
    whatever is left (embeddings, heads). `param_dtype` / `reduce_dtype` set FSDP's
    mixed precision (compute in `param_dtype`, reduce gradients in `reduce_dtype`);
    None keeps the parameters' own dtype. The model must already be on its device;
    `mesh` defaults to all ranks on that device type. Gradients are averaged over the
    ranks, as DDP does. Must be called on all processes, after the process group exists.
    """
    kwargs: dict = {"reshard_after_forward": reshard_after_forward, "mesh": mesh}
    if param_dtype is not None or reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype,
                                                   reduce_dtype=reduce_dtype)
    blocks = find_blocks(model, block_types)
    for block in blocks:
        fully_shard(block, **kwargs)
    # The root is always its own unit (FSDP2 itself keeps the root unsharded after
    # forward, since backward would gather its parameters again at once).
    fully_shard(model, **kwargs)
    log.debug("fsdp: %d blocks + root sharded (%s)", len(blocks),
              ", ".join(sorted({type(b).__name__ for b in blocks})) or "no blocks")
    return model


def is_sharded(model: nn.Module) -> bool:
    """True for a module that `shard` (or `fully_shard`) wrapped."""
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Skip the gradient reduce-scatter inside the context (accumulation micro-batches).

    The gradients accumulate unsharded until the first backward outside the context,
    which reduces the sum; this is FSDP2's `set_requires_gradient_sync(False)`. Unlike
    DDP's no_sync, they are held inside FSDP, not in `p.grad`: `zero_grad` does not drop
    them, only the next synchronised backward consumes them.
    """
    if not isinstance(model, FSDPModule):
        raise ValueError(f"fsdp.no_sync: {type(model).__name__} is not an FSDP2 module")
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def gather(model: nn.Module, into: nn.Module) -> nn.Module:
    """Copy a sharded model's full weights into `into`, a plain module of the same shape.

    The result no longer depends on the process group, so it stays usable after the group
    is destroyed (a sharded module does not: its DTensors need the group). Must be called
    on all processes while the group exists: it all-gathers every parameter.
    """
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    into.load_state_dict(state)
    return into


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank stores (its shards, not the gathered tensors)."""
    total = 0
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        total += local.numel() * local.element_size()
    return total


def bytes_per_step(model: nn.Module, world: int, accum: int, reshard_after_forward: bool,
                   param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None) -> float:
    """Bytes one rank sends per optimizer step, from the sizes (ring collectives).

    Each micro-batch all-gathers the parameters for forward, and again for backward when
    they were resharded after forward; the gradients are reduce-scattered once per step
    (accumulation keeps them unsharded until the last micro-batch). A ring all-gather or
    reduce-scatter of B bytes sends (N - 1) / N x B from each rank.
    """
    params = list(model.parameters())
    gathered = sum(p.numel() * (param_dtype or p.dtype).itemsize for p in params)
    reduced = sum(p.numel() * (reduce_dtype or param_dtype or p.dtype).itemsize
                  for p in params if p.requires_grad)
    gathers = accum * (2 if reshard_after_forward else 1)
    return (world - 1) / world * (gathered * gathers + reduced)
