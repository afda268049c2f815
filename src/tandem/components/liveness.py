"""Liveness records as a run component: every phase the loop reaches is noted, so a
hang names the rank that stopped and where (`monitor.heartbeat`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from tandem.components.base import Component, RunParts
from tandem.monitor.heartbeat import Heartbeat


class Liveness(Component):
    """Notes the loop's phase in this rank's heartbeat; stops it at the end."""

    def __init__(self, store: dist.Store | None, rank: int, world_size: int,
                 interval_s: float) -> None:
        self.args = (store, rank, world_size, interval_s)
        self.heartbeat: Heartbeat | None = None

    def setup(self, parts: RunParts) -> None:
        """Start publishing (a thread): the run is built."""
        self.heartbeat = Heartbeat(*self.args)

    def at(self, phase: str, step: int) -> None:
        """Two assignments: cheap enough for every micro-batch."""
        if self.heartbeat is not None:
            self.heartbeat.at(step, phase)

    def describe(self) -> str:
        """Where every rank was last seen."""
        if self.heartbeat is None:
            return "no liveness records (the run was not built)"
        return self.heartbeat.describe()

    def close(self) -> None:
        """Stop publishing."""
        if self.heartbeat is not None:
            self.heartbeat.close()


def last_seen(components: Sequence[Component]) -> str:
    """Where every rank was last seen (for hang reports), from the run's liveness component."""
    return next((c.describe() for c in components if isinstance(c, Liveness)),
                "no liveness records")
