"""The one interface every scheduling policy implements, and what rigid policies share.

A policy is a pure function of its inputs: `allocate(jobs, cluster, now)` looks only at
the job views (measured state), the cluster and the time, and returns the placement of
every job that should hold processes. Everything a policy remembers between calls lives
in the job views (attained service, current placement, restarts), so the live scheduler
and the simulator run the very same code and get the very same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from tandem.sched.policies.cluster import Cluster, place_spread
from tandem.sched.policies.job import JobView, Placement

Allocations = dict[str, Placement]


class Policy(Protocol):
    """Decides which jobs hold which slots."""

    name: str

    def allocate(self, jobs: Sequence[JobView], cluster: Cluster, now: float) -> Allocations:
        """Placements (sorted node index per process) of the jobs that should run.

        `jobs` are the submitted, unfinished jobs. A job missing from the result holds
        nothing (queued, or preempted if it held something). A job whose placement is
        unchanged keeps running untouched; any other change costs it a restart.
        """
        ...


def place_rigid(order: Sequence[JobView], cluster: Cluster, *, stop_at_first: bool,
                keep: Mapping[str, bool] | None = None) -> Allocations:
    """Run jobs at their requested size in `order` while slots (counted cluster-wide) last.

    A running job chosen again keeps its placement; a newly started one is spread over
    the nodes with the most free slots. `stop_at_first`: the first job that does not fit
    blocks every later one (strict FIFO); otherwise later, smaller jobs may start.
    """
    chosen: list[JobView] = []
    free = cluster.capacity
    for job in order:
        want = job.spec.max_procs
        if want <= free:
            chosen.append(job)
            free -= want
        elif stop_at_first:
            break
    allocations: Allocations = {j.job_id: j.placement for j in chosen
                                if j.size == j.spec.max_procs}
    slots = cluster.free_slots(allocations.values())
    for job in chosen:
        if job.job_id not in allocations:
            placement = place_spread(job.spec.max_procs, slots)
            assert placement is not None, "counted slots must be placeable"
            allocations[job.job_id] = placement
    return allocations
