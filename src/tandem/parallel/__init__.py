"""How the model is spread over processes: one Strategy object per plan.

`build_strategy(plan, runtime, layout, seed)` is the one place that turns the plan's
names into behaviour; everything after it talks to the Strategy interface
(`tandem.parallel.strategy`). The names and what combines with what are in
`tandem.parallel.registry`; importing this package imports no strategy (nor torch):
a strategy's module is imported when it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.parallel.registry import AUTO, DDP, FSDP, PP, PP_FSDP, REGISTRY, SINGLE, TP, either

if TYPE_CHECKING:
    from tandem.config import PlanConfig
    from tandem.parallel.mesh import Layout
    from tandem.parallel.strategy import Strategy
    from tandem.runtime import Runtime


def strategy_name(plan: PlanConfig, world_size: int) -> str:
    """The concrete strategy for this world size ("tp": data x tensor parallel)."""
    if plan.pp > 1:
        return PP_FSDP.name if plan.strategy == FSDP.name else PP.name
    if plan.tp > 1:
        return TP.name
    if plan.strategy == AUTO.name:
        return DDP.name if world_size > 1 else SINGLE.name
    if REGISTRY[plan.strategy].needs_world and world_size == 1:
        return SINGLE.name  # with one process there is nothing to synchronise
    if plan.strategy == SINGLE.name and world_size > 1:
        exact = [s.name for s in REGISTRY.values() if s.choosable and s.exact
                 and (s.needs_world or s is AUTO)]
        raise ValueError(
            f"plan.strategy: {SINGLE.name!r} cannot train on {world_size} processes; "
            f"use {either(tuple(exact))}"
        )
    return plan.strategy


def plan_layout(plan: PlanConfig, runtime: Runtime) -> Layout:
    """This rank's place on the plan's mesh: data-parallel processes shard the weights
    under a strategy that shards them, else replicate them. All processes (tp > 1 builds
    a device mesh)."""
    from tandem.parallel.mesh import layout

    shard = REGISTRY[strategy_name(plan, runtime.world_size)].load().shards_weights
    return layout(plan.tp, runtime.rank, runtime.world_size, runtime.device, shard=shard,
                  pp=plan.pp)


def build_strategy(plan: PlanConfig, runtime: Runtime, layout: Layout, seed: int) -> Strategy:
    """The Strategy object of `plan` at this world size. All processes."""
    return REGISTRY[strategy_name(plan, runtime.world_size)].load()(plan, runtime, layout, seed)


def __getattr__(name: str) -> Any:
    """`Strategy` and `STRATEGIES` (name -> class), imported when first asked for."""
    if name == "Strategy":
        return SINGLE.load()
    if name == "STRATEGIES":
        return {s.name: s.load() for s in REGISTRY.values() if s.path}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["STRATEGIES", "Strategy", "build_strategy", "plan_layout", "strategy_name"]
