"""A policy wrapper that lets every run train a while before it may be stopped again.

Live, a stop and a restart cost seconds to tens of seconds (commit, process teardown,
start-up, resume), and decisions come every few seconds and at every arrival: a policy
that orders jobs by attained service (LAS, the goodput policy's admission) would then
swap jobs back and forth, each swap paying the restart. The simulator's 60-second
interval bounds this by itself; live, `Pinned` does: a running job whose current run
started training less than `min_run` seconds ago keeps its placement, and the inner
policy divides the rest of the cluster among the other jobs. A job that has not started
training yet is pinned too (its stop could not be a graceful one).

The wrapper works on one-node clusters (the local backend, the testbed); on several
nodes the free slots of each node differ, which a `Cluster` cannot express, so there the
inner policy decides alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.job import JobView
from tandem.sched.policies.policy import Allocations, Policy


@dataclass(frozen=True)
class Pinned:
    """`inner`, with runs younger than `min_run` seconds kept where they are."""

    inner: Policy
    min_run: float = 30.0
    """Seconds a run trains before the policy may stop or resize it."""

    def __post_init__(self) -> None:
        if self.min_run < 0:
            raise ValueError(f"min_run: {self.min_run} is not allowed; need >= 0 seconds")

    @property
    def name(self) -> str:
        """The inner policy's name (the wrapper changes when, not what)."""
        return self.inner.name

    def pinned(self, job: JobView, now: float) -> bool:
        """Whether the job keeps its placement this time."""
        return (job.size > 0 and job.running_since is not None
                and now - job.running_since < self.min_run)

    def allocate(self, jobs: Sequence[JobView], cluster: Cluster, now: float) -> Allocations:
        """Pinned jobs keep their slots; the inner policy places the others in the rest."""
        if cluster.nodes != 1 or self.min_run == 0:
            return self.inner.allocate(jobs, cluster, now)
        pinned = [j for j in jobs if self.pinned(j, now)]
        if not pinned:
            return self.inner.allocate(jobs, cluster, now)
        held = sum(j.size for j in pinned)
        out: Allocations = {j.job_id: j.placement for j in pinned}
        rest = [j for j in jobs if not self.pinned(j, now)]
        free = cluster.capacity - held
        if rest and free > 0:
            out.update(self.inner.allocate(rest, Cluster(nodes=1, slots_per_node=free), now))
        return out
