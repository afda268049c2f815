"""The exchange of asynchronous updates: a log of pushes kept in the process group's store,
replayed by every worker into the same outer model.

Outer step i is made of the N pushes numbered iN ... iN + N - 1 (N: the world size), in
the order they were numbered. A push is a worker's change since its pull (its
pseudo-gradient, as DiLoCo's) and the version it pulled (v: the outer steps applied in
the model it started from). Its staleness is tau = i - v. The outer step averages the
pushes, each scaled by 1 / (1 + tau) (staleness-aware: a stale change counts less), and
applies DiLoCo's outer Nesterov step with its momentum scaled by the pushes' mean weight
(asynchrony acts as momentum of its own; with s = 0 every weight is 1: DiLoCo's step).
Every worker replays the same pushes in the same order, so every worker computes the
same outer model: there is no parameter server, and no worker waits for another to apply
anything.

The staleness bound s holds by reservation: a push is numbered only while every other
worker still training keeps a free place in an outer step at most s after its own v
(checked, with the numbering, in one compare-and-set of a small JSON state). A worker
that cannot push yet keeps training and tries again after its next step; a worker whose
place is needed by others (it is named in `blocked`) pushes its shorter round at once. A
worker waits only to pull: after pushing into step i it needs the steps up to i - s
complete. With s = 0 that is its own step: every worker pushes once per step from the
same version, which is DiLoCo's meeting. With s >= 1 the steps it needs are numbered
already (their pushes are being written), so no worker waits for a slower one.

Why the store: it is the one channel of torch.distributed that lets one process send
without its peers taking part at that moment, for every backend. A collective (gloo's
or NCCL's) needs every rank to enter it, which is the wait this strategy removes, and
NCCL has no receive from any source. Pushes pass through host memory (a GPU's copy
comes back to the host), which is why this suits small models or rare pushes; the
figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

_POLL_S = 0.0005  # between looks at the store while waiting to pull


def weight(tau: int) -> float:
    """The share a push `tau` outer steps stale keeps in its outer step."""
    return 1.0 / (1.0 + tau)


def _decode(raw: bytes) -> tuple[int, torch.Tensor]:
    """A push as written: (the version it was pulled at, its change)."""
    v = int(torch.frombuffer(bytearray(raw[:8]), dtype=torch.int64)[0])
    return v, torch.frombuffer(bytearray(raw[8:]), dtype=torch.float32)


class StalenessLog:
    """One worker's end of the log (see the module doc). `outer`, `velocity`: the flat
    fp32 outer parameters and Nesterov momentum, replayed in place."""

    def __init__(self, store: dist.Store, rank: int, world: int, staleness: int,
                 outer: torch.Tensor, outer_lr: float, outer_momentum: float,
                 timeout_s: float = 300.0) -> None:
        self.store, self.rank, self.world, self.s = store, rank, world, staleness
        self.timeout_s = timeout_s  # the longest wait for another worker
        self.outer, self.velocity = outer, torch.zeros_like(outer)
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.applied = 0  # outer steps replayed into `outer`
        self.version = 0  # the version this worker's replica started from
        self.taus: Counter[int] = Counter()  # staleness of this worker's pushes
        self.early = 0  # rounds pushed early because others needed the place

    @staticmethod
    def initial(world: int) -> str:
        """The state before any push: every worker training from version 0."""
        return json.dumps({"count": 0, "v": [0] * world, "working": [True] * world,
                           "blocked": []})

    def _state(self) -> dict[str, Any]:
        return json.loads(self.store.get("state"))

    def _swap(self, old: dict[str, Any], new: dict[str, Any]) -> bool:
        after = json.dumps(new)
        return self.store.compare_set("state", json.dumps(old), after).decode() == after

    def counted(self) -> int:
        """Pushes numbered so far."""
        return int(self._state()["count"])

    # ------------------------------------------------------------ pushing
    def needed(self) -> bool:
        """Whether others wait for this worker's place: push now, even before H steps."""
        return self.rank in self._state()["blocked"]

    def try_push(self, delta: torch.Tensor) -> int | None:
        """Number and write this worker's change, or None when that would leave another
        worker without a place within its bound (this worker then trains on)."""
        while True:
            state = self._state()
            count, v, working = state["count"], state["v"], state["working"]
            blocking = self._blocking(count, v, working)
            new = dict(state)
            if blocking:
                if set(blocking) <= set(state["blocked"]):
                    return None
                new["blocked"] = sorted(set(state["blocked"]) | set(blocking))
            else:
                new["count"] = count + 1
                new["working"] = [w and r != self.rank for r, w in enumerate(working)]
                new["blocked"] = [r for r in state["blocked"] if r != self.rank]
            if self._swap(state, new):
                break
        if blocking:
            return None
        tau = count // self.world - self.version
        assert 0 <= tau <= self.s, (tau, self.s)  # the reservations' invariant
        self.taus[tau] += 1
        header = torch.tensor([self.version], dtype=torch.int64).numpy().tobytes()
        self.store.set(f"push/{count}", header + delta.detach().float().cpu().numpy().tobytes())
        return count

    def _blocking(self, count: int, v: list[int], working: list[bool]) -> list[int]:
        """The workers still training whose places numbering push `count` would take."""
        others = [r for r in range(self.world) if working[r] and r != self.rank]
        short = []
        for r in others:
            places = (v[r] + self.s + 1) * self.world - (count + 1)
            if places < sum(1 for u in others if v[u] <= v[r]):
                short.append(r)
        if not short:
            return []
        low = min(v[r] for r in short)
        return [r for r in others if v[r] <= low]

    def leave(self) -> None:
        """Stop holding a place: this worker will push nothing more (the run ends)."""
        while True:
            state = self._state()
            new = dict(state)
            new["working"] = [w and r != self.rank for r, w in enumerate(state["working"])]
            new["blocked"] = [r for r in state["blocked"] if r != self.rank]
            if new == state or self._swap(state, new):
                return

    # ------------------------------------------------------------ pulling
    def can_pull(self, pushed: int) -> bool:
        """Whether the steps a worker that pushed number `pushed` needs are written."""
        need = pushed // self.world + 1 - self.s
        return need <= self.applied or self.store.check(self._keys(self.applied, need))

    def pull(self) -> int:
        """Replay every numbered outer step and mark this worker training from it;
        return its version. Call when `can_pull`."""
        while True:
            state = self._state()
            target = state["count"] // self.world
            self.replay(target)
            new = dict(state)
            new["v"] = [target if r == self.rank else x for r, x in enumerate(state["v"])]
            new["working"] = [w or r == self.rank for r, w in enumerate(state["working"])]
            if self._swap(state, new):
                self.version = target
                return target

    def wait_pull(self, pushed: int, give_up: Any) -> bool:
        """Wait until `can_pull(pushed)` (then pull), or until `give_up()`; whether it
        pulled."""
        deadline = time.monotonic() + self.timeout_s
        while not self.can_pull(pushed):
            if give_up():
                return False
            self._check(deadline, f"the outer step {pushed // self.world - self.s} to pull")
            time.sleep(_POLL_S)
        self.pull()
        return True

    def push_when_free(self, delta: torch.Tensor) -> int:
        """`try_push` until it numbers the push (the run's end: every worker pushes)."""
        deadline = time.monotonic() + self.timeout_s
        while (seq := self.try_push(delta)) is None:
            self._check(deadline, "a place for the last push")
            time.sleep(_POLL_S)
        return seq

    def _check(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"plan.strategy async: rank {self.rank} waited "
                               f"{self.timeout_s:.0f} s (plan.timeout_s) for {what}; a worker "
                               "stopped pushing (did one die?)")

    def replay(self, upto: int, partial: bool = False) -> None:
        """Apply outer steps `applied` ... `upto - 1` (their pushes written or being
        written); with `partial`, also the last, incomplete step of a finished log."""
        count = int(self._state()["count"]) if partial else upto * self.world
        while self.applied < upto:
            i = self.applied
            seqs = [q for q in range(i * self.world, (i + 1) * self.world) if q < count]
            self.store.wait([f"push/{q}" for q in seqs])
            self._apply(i, [_decode(self.store.get(f"push/{q}")) for q in seqs], self.world)
            self.applied += 1
            if self.store.add(f"read/{i}", 1) == self.world:  # the last reader cleans up
                for q in seqs:
                    self.store.delete_key(f"push/{q}")

    def _apply(self, i: int, pushes: list[tuple[int, torch.Tensor]], places: int) -> None:
        """Outer step `i` from `pushes` ((version pulled, change)) over `places` (the
        world size the step was numbered for)."""
        total = torch.zeros_like(self.outer)
        for v, delta in pushes:
            total.add_(delta.to(self.outer.device), alpha=weight(i - v))
        # Stale pushes carry momentum of their own (their change went on from an older
        # model): the outer momentum shrinks by the step's mean weight (1 with s = 0).
        m = self.outer_momentum * sum(weight(i - v) for v, _ in pushes) / len(pushes)
        pseudo_grad = total / places
        self.velocity.mul_(m).add_(pseudo_grad)
        self.outer.sub_(self.outer_lr * (pseudo_grad + m * self.velocity))

    def _keys(self, lo: int, hi: int) -> list[str]:
        return [f"push/{q}" for q in range(lo * self.world, hi * self.world)]

    # ------------------------------------------------------------ checkpoints
    def in_flight(self, places: int | None = None) -> dict[str, Any]:
        """The log's state and the pushes not yet in an applied outer step, as one tensor
        of fixed shape (fewer than N pushes: the same keys in every checkpoint); the same
        on every worker at a sync point, once each replayed the complete steps. `places`:
        the N of the shape (a template for a checkpoint of another world size)."""
        state = self._state()
        count = state["count"]
        first = max(count // self.world, self.applied) * self.world
        width = 8 + 4 * self.outer.numel()
        pending = torch.zeros((places or self.world) - 1, width, dtype=torch.uint8)
        for k, q in enumerate(range(first, count)):
            pending[k] = torch.frombuffer(bytearray(self.store.get(f"push/{q}")),
                                          dtype=torch.uint8)
        return {"state": json.dumps(state), "pending": pending}

    def fold(self, saved: dict[str, Any], applied: int, saved_world: int,
             unpushed: list[tuple[int, torch.Tensor]]) -> None:
        """Resume a log written by `saved_world` workers at another world size: the
        pushes it had in flight and the workers' `unpushed` changes ((version, change))
        join outer step `applied` as its last, partial step (what the end of a run does:
        every change counts once), and a new log starts, every worker at version 0 of
        the outer model that gives (rank 0 writes the store; the caller waits)."""
        state = json.loads(saved["state"])
        first = max(state["count"] // saved_world, applied) * saved_world
        pushes = [_decode(saved["pending"][k].numpy().tobytes())
                  for k in range(state["count"] - first)]
        if pushes or unpushed:
            self._apply(applied, pushes + unpushed, saved_world)
        self.applied = self.version = 0
        if self.rank == 0:
            self.store.set("state", StalenessLog.initial(self.world))

    def restore(self, saved: dict[str, Any], applied: int, version: int) -> None:
        """Put a checkpoint's log back (rank 0 writes the store; every rank its counters;
        the caller waits for rank 0 before anyone reads the store)."""
        self.applied, self.version = applied, version
        if self.rank == 0:
            count = json.loads(saved["state"])["count"]
            first = max(count // self.world, applied) * self.world
            for k, q in enumerate(range(first, count)):
                self.store.set(f"push/{q}", saved["pending"][k].numpy().tobytes())
            self.store.set("state", saved["state"])
