"""How the model is spread over processes: one Strategy object per plan.

`build_strategy(plan, runtime, layout, seed)` is the one place that turns the plan's
names into behaviour; everything after it talks to the Strategy interface
(`tandem.parallel.strategy`).
"""

from __future__ import annotations

from tandem.config import PlanConfig
from tandem.parallel.ddp import DDPStrategy
from tandem.parallel.fsdp import FSDPStrategy
from tandem.parallel.lowcomm import DiLoCoStrategy, LowCommStrategy
from tandem.parallel.mesh import Layout, layout
from tandem.parallel.strategy import Strategy
from tandem.parallel.tensor import TensorParallelStrategy
from tandem.runtime import Runtime

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Strategy, DDPStrategy, FSDPStrategy, LowCommStrategy,
                              DiLoCoStrategy, TensorParallelStrategy)}


def strategy_name(plan: PlanConfig, world_size: int) -> str:
    """The concrete strategy for this world size ("tp": data x tensor parallel)."""
    if plan.tp > 1:
        return "tp"
    if plan.strategy == "auto":
        return "ddp" if world_size > 1 else "single"
    if plan.strategy in ("ddp", "fsdp", "localsgd", "diloco") and world_size == 1:
        return "single"  # with one process there is nothing to synchronise
    if plan.strategy == "single" and world_size > 1:
        raise ValueError(
            f"plan.strategy: 'single' cannot train on {world_size} processes; "
            "use 'auto', 'ddp' or 'fsdp'"
        )
    return plan.strategy


def plan_layout(plan: PlanConfig, runtime: Runtime) -> Layout:
    """This rank's place on the plan's mesh: data-parallel processes shard the weights
    under a strategy that shards them, else replicate them. All processes (tp > 1 builds
    a device mesh)."""
    shard = STRATEGIES[strategy_name(plan, runtime.world_size)].shards_weights
    return layout(plan.tp, runtime.rank, runtime.world_size, runtime.device, shard=shard)


def build_strategy(plan: PlanConfig, runtime: Runtime, layout: Layout, seed: int) -> Strategy:
    """The Strategy object of `plan` at this world size. All processes."""
    return STRATEGIES[strategy_name(plan, runtime.world_size)](plan, runtime, layout, seed)


__all__ = ["STRATEGIES", "Strategy", "build_strategy", "plan_layout", "strategy_name"]
