"""How the model is spread over processes: one seam, `wrap(model, plan, runtime)`."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.config import PlanConfig
from tandem.parallel import fsdp, hooks, tensor
from tandem.parallel.compiled import maybe_compile
from tandem.parallel.hierarchical import register_hierarchical
from tandem.parallel.recompute import checkpoint_blocks
from tandem.runtime import Runtime

log = logging.getLogger("tandem")

DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Byte counters of the DDP comm hooks in force, by wrapped model (read by the monitor).
_COMM_STATS: weakref.WeakKeyDictionary[nn.Module, hooks.CommStats] = (
    weakref.WeakKeyDictionary())


def resolve_strategy(plan: PlanConfig, runtime: Runtime) -> str:
    """The concrete strategy for this world size ("tp": data x tensor parallel)."""
    if plan.tp > 1:
        return "tp"
    if plan.strategy == "auto":
        return "ddp" if runtime.distributed else "single"
    if plan.strategy in ("ddp", "fsdp", "localsgd", "diloco") and not runtime.distributed:
        return "single"  # with one process there is nothing to synchronise
    if plan.strategy == "single" and runtime.distributed:
        raise ValueError(
            f"plan.strategy: 'single' cannot train on {runtime.world_size} processes; "
            "use 'auto', 'ddp' or 'fsdp'"
        )
    return plan.strategy


def wrap(model: nn.Module, plan: PlanConfig, runtime: Runtime,
         layout: tensor.Layout | None = None,
         tensor_plan: Mapping[str, str] | None = None) -> nn.Module:
    """Place `model` on the device, apply the plan's activation checkpointing, tensor
    parallelism (`layout`, `tensor_plan`) and compilation, and wrap it for the strategy.

    Must be called on all processes, after the process group exists.
    """
    model = model.to(runtime.device)
    if plan.activation_checkpointing:
        checkpoint_blocks(model)
    strategy = resolve_strategy(plan, runtime)
    if strategy == "tp":
        if layout is None or layout.tp_mesh is None:
            raise ValueError("plan.tp > 1 needs the (dp, tp) layout of the ranks")
        if not tensor_plan:
            raise ValueError(f"plan.tp: {plan.tp} needs the task to name the layers to split "
                             "(Task.tensor_parallel = {'blocks.*.mlp.fc': 'colwise', ...})")
        tensor.parallelize(model, tensor_plan, layout.tp_mesh)
    if plan.compile:
        maybe_compile(model, runtime.device)
    if strategy in ("single", "localsgd", "diloco", "tp"):
        return model  # low-communication replicas meet through LowCommSync, not a wrapper
    if strategy == "fsdp":
        return fsdp.shard(model, reshard_after_forward=plan.fsdp_reshard,
                          param_dtype=DTYPES[plan.fsdp_param_dtype],
                          reduce_dtype=DTYPES[plan.fsdp_reduce_dtype])
    ddp = DistributedDataParallel(
        model,
        device_ids=[runtime.device.index] if runtime.device.type == "cuda" else None,
        bucket_cap_mb=plan.bucket_mb,
        static_graph=plan.static_graph,
        find_unused_parameters=plan.find_unused,
        gradient_as_bucket_view=True,
    )
    _register_hook(ddp, plan, runtime)
    return ddp


def _register_hook(ddp: DistributedDataParallel, plan: PlanConfig, runtime: Runtime) -> None:
    if plan.comm_hook != "hierarchical":
        _COMM_STATS[ddp] = hooks.register(
            ddp, plan.comm_hook, backend=dist.get_backend(), powersgd_rank=plan.powersgd_rank,
            powersgd_warmup=plan.powersgd_warmup, topk_ratio=plan.topk_ratio)
    elif runtime.local_world_size in (1, runtime.world_size):
        # One node (or one process per node): two levels would only add a step.
        log.warning("plan.comm_hook 'hierarchical' on %d node(s) of %d processes: using "
                    "DDP's flat all-reduce", runtime.world_size // runtime.local_world_size,
                    runtime.local_world_size)
    else:
        register_hierarchical(ddp, runtime.local_world_size)


def comm_stats(model: nn.Module) -> hooks.CommStats | None:
    """Bytes per step sent by the wrapped model's DDP comm hook (None: not DDP)."""
    return _COMM_STATS.get(model)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside any wrapper (an FSDP2 module is its own module)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """A context that skips gradient synchronisation (accumulation micro-batches)."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    if fsdp.is_sharded(model):
        return fsdp.no_sync(model)
    return contextlib.nullcontext()
