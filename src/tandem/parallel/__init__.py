"""How the model is spread over processes: one seam, `wrap(model, plan, runtime)`."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.config import PlanConfig
from tandem.runtime import Runtime


def resolve_strategy(plan: PlanConfig, runtime: Runtime) -> str:
    """The concrete strategy for this world size."""
    if plan.strategy == "auto":
        return "ddp" if runtime.distributed else "single"
    if plan.strategy in ("ddp", "localsgd", "diloco") and not runtime.distributed:
        return "single"  # with one process there is nothing to synchronise
    if plan.strategy == "single" and runtime.distributed:
        raise ValueError(
            f"plan.strategy: 'single' cannot train on {runtime.world_size} processes; "
            "use 'auto' or 'ddp'"
        )
    return plan.strategy


def wrap(model: nn.Module, plan: PlanConfig, runtime: Runtime) -> nn.Module:
    """Place `model` on the device and wrap it for the plan's strategy.

    Must be called on all processes, after the process group exists.
    """
    model = model.to(runtime.device)
    strategy = resolve_strategy(plan, runtime)
    if strategy in ("single", "localsgd", "diloco"):
        return model  # low-communication replicas meet through LowCommSync, not a wrapper
    return DistributedDataParallel(
        model,
        device_ids=[runtime.device.index] if runtime.device.type == "cuda" else None,
        bucket_cap_mb=plan.bucket_mb,
        static_graph=plan.static_graph,
        find_unused_parameters=plan.find_unused,
        gradient_as_bucket_view=True,
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside any wrapper."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def no_sync(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """A context that skips gradient synchronisation (accumulation micro-batches)."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


