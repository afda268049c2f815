"""First in, first out: jobs start in submission order at their requested size, never preempted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.job import JobView
from tandem.sched.policies.policy import Allocations, place_rigid


@dataclass(frozen=True)
class FIFOPolicy:
    """Run jobs in submission order; a running job keeps its slots until it ends.

    `backfill=False` (strict FIFO): a job that does not fit holds back all later ones.
    `backfill=True`: later jobs that fit in the gap may start (they still never preempt).
    """

    backfill: bool = False
    name: str = "fifo"

    def allocate(self, jobs: Sequence[JobView], cluster: Cluster, now: float) -> Allocations:
        """Running jobs first (never preempted), then waiting ones by submission time."""
        del now  # FIFO depends on order only
        for job in jobs:
            if job.size and job.size != job.spec.max_procs:
                raise ValueError(f"job {job.job_id!r} holds {job.size} processes; FIFO runs "
                                 f"jobs only at their requested size {job.spec.max_procs}")
        order = sorted(jobs, key=lambda j: (j.size == 0, j.spec.submit_time, j.job_id))
        return place_rigid(order, cluster, stop_at_first=not self.backfill)
