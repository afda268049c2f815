"""Shares of the global batches handed out to workers that train at their own pace.

Global batch t is the same list of samples as under every other plan; its N equal shares
are (t, 0) ... (t, N - 1), share u being what data-parallel rank u would train on. Worker
u takes its own shares in step order: a counter per worker in the process group's store,
moved by compare-and-set, so a share is taken once. With `steal_after` H, a worker also
takes the next share of a worker more than H steps behind its own, and, at a sync point,
any share still untaken before it: a straggler's shares do not wait for it. Without it
(a synchronous plan) each worker takes exactly its own shares, as a data-parallel rank.
"""

from __future__ import annotations

import torch.distributed as dist


class SliceClaims:
    """One worker's view of the share counters (see the module doc)."""

    def __init__(self, store: dist.Store, rank: int, world: int,
                 steal_after: int | None) -> None:
        self.store, self.rank, self.world, self.steal_after = store, rank, world, steal_after

    def reset(self, step: int) -> None:
        """Every worker's next share is of global batch `step` (rank 0 writes; the caller
        waits for it on every rank)."""
        if self.rank == 0:
            for u in range(self.world):
                self.store.set(f"share/{u}", f"{step}:-1")

    def _raw(self) -> list[str]:
        # "t:w": the next share is of batch t; worker w moved it there (tells each mover
        # whether its own compare-and-set won).
        return [x.decode() for x in self.store.multi_get([f"share/{u}"
                                                          for u in range(self.world)])]

    def _next(self) -> list[int]:
        return [int(x.split(":")[0]) for x in self._raw()]

    def _victim(self, nexts: list[int], limit: int) -> int | None:
        if self.steal_after is None:
            return None
        own = nexts[self.rank]
        behind = [u for u in range(self.world) if u != self.rank and nexts[u] < limit
                  and (own >= limit or nexts[u] < own - self.steal_after)]
        return min(behind, key=lambda u: nexts[u]) if behind else None

    def available(self, limit: int) -> bool:
        """Whether `claim(limit)` would find a share now."""
        nexts = self._next()
        return nexts[self.rank] < limit or self._victim(nexts, limit) is not None

    def claim(self, limit: int) -> tuple[int, int] | None:
        """Take a share (global batch t, share u) with t < `limit`; None when there is none
        for this worker."""
        while True:
            raw = self._raw()
            nexts = [int(x.split(":")[0]) for x in raw]
            victim = self._victim(nexts, limit)
            owner = victim if victim is not None else self.rank
            t = nexts[owner]
            if t >= limit:
                return None
            mine = f"{t + 1}:{self.rank}"
            if self.store.compare_set(f"share/{owner}", raw[owner], mine).decode() == mine:
                return t, owner
