"""Bounded-staleness asynchronous updates (`plan.strategy async`, `plan.staleness` s).

Each worker trains its own replica, as under DiLoCo, but never waits for the others to
meet: after H = `plan.sync_every` local steps it pushes its change since its last pull
and pulls the newest outer model (`tandem.parallel.async_log`: the log of pushes, the
staleness-aware outer step, the bound). A slow worker pushes less often, its changes are
up to s outer steps stale and count 1 / (1 + tau) of a fresh one; it holds nobody. With
s = 0 every worker pushes once per outer step from the same model: DiLoCo's meeting.

The trainer lets each worker take local steps at its own pace between the run's sync
points (`tandem.trainer.pace`): a local step trains on one worker's share of one global
batch, handed out by `tandem.data.claims`, so every sample is used once.

Checkpoints (taken at a sync point) hold the outer model and momentum, the pushes of the
outer step not yet complete, and each worker's replica, the model it pulled, its steps
since and its optimizer. A resume at another number of workers folds every worker's
change not yet pushed, and the pushes in flight, into the outer model (the run's end
does the same) and starts every worker from it: a sample trained before the checkpoint
counts once, and the data goes on from the checkpoint's step.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from tandem.data.claims import SliceClaims
from tandem.monitor.catalogue import (
    ASYNC_EARLY_PUSHES,
    ASYNC_FRESH,
    ASYNC_LOCAL_STEPS,
    ASYNC_PUSHES,
    ASYNC_STALENESS_MAX,
    ASYNC_STALENESS_MEAN,
    COMM_BYTES_PER_STEP,
    COMM_PULL_WAIT,
)
from tandem.parallel.async_log import StalenessLog
from tandem.parallel.flat_state import assign, cloned, flat, overlay
from tandem.parallel.registry import ASYNC, StrategyInfo
from tandem.parallel.strategy import Strategy


class AsyncStrategy(Strategy):
    """Bounded-staleness asynchronous DiLoCo (see the module doc)."""

    info: ClassVar[StrategyInfo] = ASYNC
    log: StalenessLog | None = None

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan = self.plan
        self.tensors = [p for p in model.parameters()] + [b for b in model.buffers()
                                                          if b.is_floating_point()]
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        for t in self.tensors:  # every replica starts from the same point
            dist.broadcast(t.data, src=0)
        token = [uuid.uuid4().hex if self.rank == 0 else ""]
        dist.broadcast_object_list(token, src=0)  # this run's keys, apart from any other's
        store = dist.PrefixStore(f"tandem-async/{token[0]}/",
                                 dist.distributed_c10d._get_default_store())
        outer = flat(self.tensors)
        self.log = StalenessLog(store, self.rank, self.world, plan.staleness, outer,
                                plan.outer_lr, plan.outer_momentum, plan.timeout_s)
        self.claims = SliceClaims(store, self.rank, self.world,
                                  steal_after=plan.sync_every if plan.staleness else None)
        if self.rank == 0:
            store.set("state", StalenessLog.initial(self.world))
        self.start = outer.clone()  # the outer model this replica last pulled
        self.inner = 0  # local steps since the pull
        self.pushed: int | None = None  # the number of a push not yet followed by a pull
        self.per_replica: dict[str, Any] = {}
        self.saved_world = self.world  # the workers of the checkpoint to be loaded
        self._reset_counters()
        dist.barrier()
        return model

    def _reset_counters(self) -> None:
        self.local_steps, self.pushes, self.sent, self.waited_s = 0, 0, 0, 0.0
        assert self.log is not None
        self.log.early = 0

    # ------------------------------------------------------------ the pace's hooks
    def begin(self, step: int) -> None:
        """A stretch of free-running steps starts at global step `step`. All ranks."""
        self.claims.reset(step)
        dist.barrier()

    def ready(self, exhausted: Any) -> bool:
        """Pull the model a push is waiting for; False when `exhausted()` comes first
        (the stretch's shares are all taken: go to the sync point, pull after it)."""
        assert self.log is not None
        if self.pushed is None:
            return True
        began = time.perf_counter()
        pulled = self.log.wait_pull(self.pushed, exhausted)
        self.waited_s += time.perf_counter() - began
        if pulled:
            self._restart()
        return pulled

    def after_local_step(self) -> None:
        """After a local step: push after H of them, or now when others need the place."""
        assert self.log is not None
        self.inner += 1
        self.local_steps += 1
        if self.pushed is not None:
            return  # pushed and not yet pulled (its round is being waited for)
        if self.inner >= self.plan.sync_every:
            self._push()
        elif self.plan.staleness and self.log.needed():
            if self._push():
                self.log.early += 1

    def _push(self) -> bool:
        assert self.log is not None
        delta = self.start - flat(self.tensors)
        seq = self.log.try_push(delta)
        if seq is None:
            return False
        self.pushed, self.inner = seq, 0
        self.pushes += 1
        self.sent += delta.numel() * 4 + 8
        if self.log.can_pull(seq):
            self.log.pull()
            self._restart()
        return True

    def _restart(self) -> None:
        assert self.log is not None
        self.start.copy_(self.log.outer)
        assign(self.start, self.tensors)
        self.pushed = None

    def finish(self) -> None:
        """After the run's last step: push what is left, replay every push, and every
        replica takes the outer model. All ranks."""
        assert self.log is not None
        if self.pushed is None and self.inner:
            self.log.push_when_free(self.start - flat(self.tensors))  # others may need
            self.pushes += 1  # their places first
        self.log.leave()
        dist.barrier()
        count = self.log.counted()
        self.log.replay(-(-count // self.world), partial=True)
        self._restart()
        self.inner = 0

    # ------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Evaluate the outer model (every complete outer step), not this replica."""
        assert self.log is not None
        self.log.replay(self.log.counted() // self.world)
        own = flat(self.tensors)
        assign(self.log.outer, self.tensors)
        try:
            yield
        finally:
            assign(own, self.tensors)

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, Any]:
        """Per worker: local steps, pushes (and those pushed early), the wait to pull and
        bytes pushed per local step since the last call; the staleness of its pushes so
        far (mean, max, share of fresh ones). All ranks (one all-gather)."""
        assert self.log is not None
        taus, local = self.log.taus, max(1, self.local_steps)
        n = sum(taus.values())
        mine = torch.tensor([
            self.local_steps, self.pushes, self.log.early, self.waited_s / local,
            self.sent / local, sum(t * c for t, c in taus.items()) / n if n else math.nan,
            max(taus) if n else math.nan, taus[0] / n if n else math.nan],
            dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        self._reset_counters()
        names = (ASYNC_LOCAL_STEPS, ASYNC_PUSHES, ASYNC_EARLY_PUSHES, COMM_PULL_WAIT,
                 COMM_BYTES_PER_STEP, ASYNC_STALENESS_MEAN, ASYNC_STALENESS_MAX,
                 ASYNC_FRESH)
        table = torch.stack(everyone).T.tolist()
        return {name: column for name, column in zip(names, table, strict=True)
                if not any(math.isnan(v) for v in column)}

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The outer state, the pushes in flight and this rank's round (its own keys)."""
        assert self.log is not None
        self.log.replay(self.log.counted() // self.world)
        held = {name: state.state_dict() for name, state in self.per_replica.items()}
        # Tensors: a checkpoint keeps one rank's plain values, but every rank's tensors.
        round_ = torch.tensor([self.log.version, self.inner,
                               -1 if self.pushed is None else self.pushed])
        replica = cloned({"weights": dict(enumerate(self.tensors)), "start": self.start,
                           "round": round_, **held})
        # Loading a checkpoint of another world size, every rank reads every replica.
        ranks = range(self.saved_world) if self.saved_world != self.world else [self.rank]
        return {"outer": self.log.outer, "velocity": self.log.velocity,
                "applied": self.log.applied, "log": self.log.in_flight(self.saved_world),
                **{f"replica{r}": replica if r == self.rank else cloned(replica)
                   for r in ranks}, "world": self.world}

    def expect_saved_world(self, world: int) -> None:
        """The checkpoint to be loaded was written by `world` workers."""
        self.saved_world = world

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output (written by as many workers or, after
        `expect_saved_world`, by another number). All ranks."""
        assert self.log is not None
        saved = int(state["world"])
        if saved != self.world and self.saved_world != saved:
            raise ValueError(f"plan.strategy async: the checkpoint holds the replicas of "
                             f"{saved} workers, not announced by expect_saved_world")
        self.saved_world = self.world
        if saved != self.world:
            self._load_resized(state, saved)
            return
        self.log.outer.copy_(state["outer"])
        self.log.velocity.copy_(state["velocity"])
        replica = state[f"replica{self.rank}"]
        version, self.inner, pushed = (int(x) for x in replica["round"])
        self.log.restore(state["log"], int(state["applied"]), version)
        self.pushed = None if pushed < 0 else pushed
        self.start.copy_(replica["start"])
        with torch.no_grad():
            for i, t in enumerate(self.tensors):
                t.copy_(replica["weights"][str(i)])
        for name, held in self.per_replica.items():
            held.load_state_dict(overlay(state["replica0"].get(name), replica.get(name)))
        dist.barrier()  # the store holds the log again before anyone reads it

    def _load_resized(self, state: dict[str, Any], saved: int) -> None:
        """A checkpoint of `saved` workers on this world: each worker's change not yet
        pushed and the pushes in flight make the outer model's last step (every trained
        sample counts once); every worker starts a new log from that model, rank r with
        old worker r's optimizer (r mod `saved`: a new worker takes an old one's)."""
        assert self.log is not None
        self.log.outer.copy_(state["outer"])
        self.log.velocity.copy_(state["velocity"])
        unpushed = []
        for r in range(saved):
            replica = state[f"replica{r}"]
            version, inner, pushed = (int(x) for x in replica["round"])
            if pushed < 0 and inner > 0:  # a pushed change waits in the log already
                weights = flat([replica["weights"][str(i)] for i in range(len(self.tensors))])
                unpushed.append((version, replica["start"].float() - weights))
        self.log.fold(state["log"], int(state["applied"]), saved, unpushed)
        self.start.copy_(self.log.outer)
        assign(self.start, self.tensors)
        self.inner, self.pushed = 0, None
        own = state[f"replica{self.rank % saved}"]
        for name, held in self.per_replica.items():
            held.load_state_dict(overlay(state["replica0"].get(name), own.get(name)))
        dist.barrier()  # the store holds the new log before anyone reads it

    def fresh_start(self) -> None:
        """Resumed from another plan's checkpoint: the outer model is its weights."""
        assert self.log is not None
        self.log.outer.copy_(flat(self.tensors))
        self.log.velocity.zero_()
        self.start.copy_(self.log.outer)

    def keep_per_replica(self, name: str, state: Any) -> None:
        """Keep this rank's own `state` (the optimizer's) in checkpoints."""
        self.per_replica[name] = state

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        plan = self.plan
        return {"strategy": self.name, "staleness": plan.staleness,
                "sync_every": plan.sync_every, "outer_lr": plan.outer_lr,
                "outer_momentum": plan.outer_momentum}
