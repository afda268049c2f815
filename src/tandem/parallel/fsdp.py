"""Fully sharded data parallelism with FSDP2 (`fully_shard`): blocks first, then the root.

FSDP2 is imported by the functions that use it, not with this module: it imports DTensor,
a large part of start-up, which every plan would pay otherwise.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from tandem.monitor.catalogue import COMM_BYTES_PER_STEP
from tandem.parallel.blocks import find_blocks
from tandem.parallel.registry import FSDP, StrategyInfo
from tandem.parallel.strategy import Build, Pass, Strategy

log = logging.getLogger("tandem")


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
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

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


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Skip the gradient reduce-scatter inside the context (accumulation micro-batches).

    The gradients accumulate unsharded until the first backward outside the context,
    which reduces the sum; this is FSDP2's `set_requires_gradient_sync(False)`. Unlike
    DDP's no_sync, they are held inside FSDP, not in `p.grad`: `zero_grad` does not drop
    them, only the next synchronised backward consumes them.
    """
    from torch.distributed.fsdp import FSDPModule

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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    into.load_state_dict(state)
    return into


def bytes_per_step(model: nn.Module, world: int, accum: int, reshard_after_forward: bool,
                   param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None) -> float:
    """Bytes one rank sends per optimizer step, from the sizes (ring collectives).

    Each micro-batch all-gathers the parameters for forward, and a unit's again for
    backward when it was resharded after forward: FSDP2 never reshards the root's (the
    parameters in no inner unit; a model with no inner unit is all root) between its
    forward and backward. The gradients are reduce-scattered once per step (accumulation
    keeps them unsharded until the last micro-batch). A ring all-gather or reduce-scatter
    of B bytes sends (N - 1) / N x B from each rank.
    """
    from torch.distributed.fsdp import FSDPModule

    inner = {id(p) for unit in model.modules() if isinstance(unit, FSDPModule)
             and unit is not model for p in unit.parameters()}
    params = list(model.parameters())
    twice = 2 if reshard_after_forward else 1
    gathered = sum(p.numel() * (param_dtype or p.dtype).itemsize
                   * accum * (twice if id(p) in inner else 1) for p in params)
    reduced = sum(p.numel() * (reduce_dtype or param_dtype or p.dtype).itemsize
                  for p in params if p.requires_grad)
    return (world - 1) / world * (gathered + reduced)


DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class FSDPStrategy(Strategy):
    """FSDP2: parameters, gradients and optimizer state sharded over the ranks."""

    info: ClassVar[StrategyInfo] = FSDP
    shards_weights: ClassVar[bool] = True
    wraps_meta: ClassVar[bool] = True
    times_comm: ClassVar[bool] = False  # FSDP2's collectives run inside its own hooks

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan = self.plan
        return shard(model, reshard_after_forward=plan.fsdp_reshard,
                     param_dtype=DTYPES[plan.fsdp_param_dtype],
                     reduce_dtype=DTYPES[plan.fsdp_reduce_dtype])

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Keep the gradients unsharded until the last micro-batch reduces their sum."""
        assert self.model is not None, "wrap() first"
        return no_sync(self.model)

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float]:
        """Bytes per step from the sizes: FSDP2 counts nothing itself."""
        assert self.model is not None, "wrap() first"
        plan = self.plan
        accum = max(1, round(micro_batches / max(steps, 1)))
        return {COMM_BYTES_PER_STEP: bytes_per_step(
            self.model, self.runtime.world_size, accum, plan.fsdp_reshard,
            DTYPES[plan.fsdp_param_dtype], DTYPES[plan.fsdp_reduce_dtype])}

    def weights_replaced(self) -> None:
        """Free every unit's gathered parameters: the root keeps its own after a forward
        (and every unit does without resharding), and the next forward would use those."""
        from torch.distributed.fsdp import FSDPModule

        assert self.model is not None, "wrap() first"
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    @contextlib.contextmanager
    def calibrating(self, one_pass: Pass) -> Iterator[None]:
        """FSDP2 keeps no-sync gradients outside p.grad, where zero_grad cannot reach them,
        until the next synchronised backward: one such pass consumes them afterwards."""
        try:
            yield
        finally:
            one_pass(True)

    def export_model(self, build: Build) -> nn.Module | None:
        """The full weights gathered into a fresh plain module on every rank.

        Under deferred initialisation the model need not fit in one process, so nothing
        is gathered (None): the weights are in the run's checkpoints.
        """
        assert self.model is not None, "wrap() first"
        if self.plan.init == "deferred":
            return None
        return gather(self.model, build().to(self.runtime.device))

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        return {"strategy": self.name, "fsdp_reshard": self.plan.fsdp_reshard,
                "fsdp_param_dtype": self.plan.fsdp_param_dtype,
                "fsdp_reduce_dtype": self.plan.fsdp_reduce_dtype}
