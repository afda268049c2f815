"""The cluster (nodes x slots) and how allocations are laid onto its nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tandem.sched.policies.job import Placement


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A homogeneous cluster: `nodes` machines with `slots_per_node` process slots (GPUs) each."""

    nodes: int = 16
    """Number of nodes."""
    slots_per_node: int = 4
    """Process slots (accelerators) on each node."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes: {self.nodes} is not allowed; need >= 1")
        if self.slots_per_node < 1:
            raise ValueError(f"slots_per_node: {self.slots_per_node} is not allowed; need >= 1")

    @property
    def capacity(self) -> int:
        """Total slots."""
        return self.nodes * self.slots_per_node

    def min_nodes(self, procs: int) -> int:
        """Fewest nodes that can hold `procs` processes."""
        return -(-procs // self.slots_per_node) if procs > 0 else 0

    def free_slots(self, allocations: Iterable[Placement]) -> list[int]:
        """Free slots per node once `allocations` are laid down; raises if they overfill."""
        free = [self.slots_per_node] * self.nodes
        for placement in allocations:
            for node in placement:
                if not 0 <= node < self.nodes:
                    raise ValueError(f"placement: node {node} is outside 0..{self.nodes - 1}")
                free[node] -= 1
                if free[node] < 0:
                    raise ValueError(f"placement: node {node} is given more than "
                                     f"{self.slots_per_node} processes")
        return free


def node_counts(placement: Placement) -> tuple[int, ...]:
    """Processes per used node, in node order: (0, 0, 1, 1, 1) -> (2, 3)."""
    counts: dict[int, int] = {}
    for node in placement:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts[node] for node in sorted(counts))


def check_allocations(allocations: Mapping[str, Placement], cluster: Cluster) -> None:
    """Raise ValueError unless every placement is sorted and all fit in the cluster together."""
    for job_id, placement in allocations.items():
        if list(placement) != sorted(placement):
            raise ValueError(f"allocation of {job_id!r}: {placement} is not sorted")
    cluster.free_slots(allocations.values())


def place_spread(procs: int, free: list[int]) -> Placement | None:
    """Take slots from the node with the most free slots, again and again (ties: lowest index).

    This is how Tiresias-style schedulers place a job anywhere it fits by count; it
    consumes `free` in place. Returns None (and leaves `free` alone) if too few slots.
    """
    if procs > sum(free):
        return None
    taken: list[int] = []
    while len(taken) < procs:
        node = max(range(len(free)), key=lambda n: (free[n], -n))
        take = min(free[node], procs - len(taken))
        taken.extend([node] * take)
        free[node] -= take
    return tuple(sorted(taken))


def place_packed(procs: int, free: list[int]) -> Placement | None:
    """Put `procs` processes on as few nodes as possible, consuming `free` in place.

    A job that fits on one node goes to the node whose free slots fit it most tightly
    (keeping whole nodes free for larger jobs); a larger one takes the emptiest nodes
    first. Returns None (and leaves `free` alone) if too few slots are free.
    """
    if procs > sum(free):
        return None
    fits = [n for n in range(len(free)) if free[n] >= procs]
    if fits:
        node = min(fits, key=lambda n: (free[n], n))
        free[node] -= procs
        return (node,) * procs
    return place_spread(procs, free)
