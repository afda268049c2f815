"""The strategies by name: what each is called, where its class lives and what it combines
with.

One table, read by the config schema (the allowed `plan.strategy` values and their help),
by validation (which strategies take a DDP communication hook, the shared-memory
all-reduce, tensor parallelism), by the tuner (which changes keep the training math) and
by `build_strategy`, the one place that constructs a strategy. Each `Strategy` subclass
carries its entry (`Strategy.info`). Classes are named by import path and imported only
when built, so reading this table never imports torch's DTensor or FSDP.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.parallel.strategy import Strategy


@dataclass(frozen=True)
class StrategyInfo:
    """One strategy's name, its class's import path and its combination rules."""

    name: str
    path: str
    """`module:Class`, imported when the strategy is built ("" for `auto`, which resolves
    to another entry)."""
    summary: str
    """Its help in the config reference."""
    choosable: bool = True
    """A `plan.strategy` value (tp is chosen by `plan.tp` instead)."""
    takes_tp: bool = False
    """Composes with tensor parallelism (`plan.tp` > 1)."""
    takes_comm_hook: bool = False
    """A DDP communication hook (`plan.comm_hook`) applies."""
    takes_host_allreduce: bool = False
    """The shared-memory gradient all-reduce (`plan.host_allreduce`) can carry it."""
    exact: bool = False
    """Trains with one process's math (the same weights, within float tolerance)."""
    meets_every: bool = False
    """Replicas train alone and meet every `plan.sync_every` steps."""
    needs_world: bool = False
    """Has nothing to do on one process: runs as `single` there."""
    saves_replicas: bool = False
    """Checkpoints hold every replica's own weights: one may fall between meetings."""
    resizes: bool = False
    """With `saves_replicas`: its checkpoint resumes at another world size too (the
    replicas' changes are folded into the outer model)."""
    free_running: bool = False
    """Workers take local steps at their own pace between the run's sync points (windows,
    evaluations, checkpoints): the trainer's async pace, not one step on every rank."""

    def load(self) -> type[Strategy]:
        """The strategy class (imported now)."""
        module, _, cls = self.path.partition(":")
        return getattr(importlib.import_module(module), cls)


AUTO = StrategyInfo(
    name="auto", path="", summary="no wrapper for one process, DDP for more",
    takes_tp=True, takes_comm_hook=True, takes_host_allreduce=True, exact=True)
SINGLE = StrategyInfo(
    name="single", path="tandem.parallel.strategy:Strategy",
    summary="one process holds and updates the whole model", exact=True)
DDP = StrategyInfo(
    name="ddp", path="tandem.parallel.ddp:DDPStrategy",
    summary="a replica per process, gradients all-reduced in buckets during backward",
    takes_tp=True, takes_comm_hook=True, takes_host_allreduce=True, exact=True,
    needs_world=True)
FSDP = StrategyInfo(
    name="fsdp", path="tandem.parallel.fsdp:FSDPStrategy",
    summary="FSDP2: parameters, gradients and optimizer state sharded over the processes",
    exact=True, needs_world=True)
LOCALSGD = StrategyInfo(
    name="localsgd", path="tandem.parallel.lowcomm:LowCommStrategy",
    summary="average the replicas every sync_every steps", meets_every=True,
    needs_world=True)
DILOCO = StrategyInfo(
    name="diloco", path="tandem.parallel.lowcomm:DiLoCoStrategy",
    summary="outer Nesterov step on the averaged change every sync_every steps",
    meets_every=True, needs_world=True)
STREAMING_DILOCO = StrategyInfo(
    name="streaming_diloco", path="tandem.parallel.streaming:StreamingDiLoCoStrategy",
    summary="diloco in plan.fragments parts meeting at staggered steps, each part's sum "
    "overlapped with plan.overlap_steps inner steps", meets_every=True, needs_world=True,
    saves_replicas=True)
ASYNC = StrategyInfo(
    name="async", path="tandem.parallel.asynchronous:AsyncStrategy",
    summary="workers push their change every sync_every steps and pull the averaged model "
    "without waiting for each other, an update at most plan.staleness outer steps stale "
    "(0: synchronous, as diloco)", meets_every=True, needs_world=True, saves_replicas=True,
    resizes=True, free_running=True)
TP = StrategyInfo(
    name="tp", path="tandem.parallel.tensor:TensorParallelStrategy",
    summary="data x tensor parallel, chosen by plan.tp > 1", choosable=False,
    exact=True)
PP = StrategyInfo(
    name="pp", path="tandem.parallel.pipeline:PipelineStrategy",
    summary="pipeline stages x data-parallel replicas (x tensor-parallel peers with "
    "plan.tp > 1), chosen by plan.pp > 1",
    choosable=False, exact=True)
PP_FSDP = StrategyInfo(
    name="pp_fsdp", path="tandem.parallel.pipeline_fsdp:PipelineFSDPStrategy",
    summary="pipeline stages x FSDP2 shards of each stage (x tensor-parallel peers with "
    "plan.tp > 1), chosen by plan.pp > 1 with plan.strategy fsdp", choosable=False,
    exact=True)

REGISTRY: dict[str, StrategyInfo] = {
    s.name: s for s in (AUTO, SINGLE, DDP, FSDP, LOCALSGD, DILOCO, STREAMING_DILOCO, ASYNC, TP,
                             PP, PP_FSDP)}
# The values `plan.strategy` accepts, in the order the reference lists them.
CHOICES: tuple[str, ...] = tuple(s.name for s in REGISTRY.values() if s.choosable)


def names(rule: str) -> tuple[str, ...]:
    """The `plan.strategy` values whose `rule` (a StrategyInfo flag) holds."""
    return tuple(s.name for s in REGISTRY.values() if s.choosable and getattr(s, rule))


def either(values: tuple[str, ...]) -> str:
    """'a', 'a' or 'b', 'a', 'b' or 'c': values for a message."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def help_text() -> str:
    """The config reference's line for `plan.strategy`."""
    return "; ".join(f"{s.name}: {s.summary}" for s in REGISTRY.values() if s.choosable)
