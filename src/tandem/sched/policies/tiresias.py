"""Tiresias-like discretised two-dimensional least-attained-service (2D-LAS) scheduling.

Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning" (NSDI 2019):
a job's attained service is its GPUs x time. Priority queues are cut at service
thresholds; a job starts in the first queue and is demoted when its service passes the
queue's threshold. Queues are served in order, FIFO (by submission) inside a queue, and
each job runs at the size it asked for. A job of a lower queue is preempted when
higher-priority jobs need its slots; a job that does not fit is skipped, so a smaller one
behind it may run. Placement is by count: a job may span any nodes with free slots.

The defaults are those of the published comparison in the Pollux paper: two queues cut at
16 GPU-hours, no starvation promotion.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.job import JobView
from tandem.sched.policies.policy import Allocations, place_rigid


@dataclass(frozen=True)
class TiresiasPolicy:
    """Least attained service first, with service discretised into priority queues."""

    thresholds: tuple[float, ...] = (16 * 3600.0,)
    """Attained service (process-seconds) at which a job moves to the next queue."""
    name: str = "tiresias"

    def __post_init__(self) -> None:
        if list(self.thresholds) != sorted(self.thresholds) or any(
                t <= 0 for t in self.thresholds):
            raise ValueError(f"thresholds: {self.thresholds} must be positive and increasing")

    def queue(self, job: JobView) -> int:
        """Index of the priority queue the job is in (0 = highest)."""
        return bisect.bisect_right(self.thresholds, job.attained_service)

    def allocate(self, jobs: Sequence[JobView], cluster: Cluster, now: float) -> Allocations:
        """Serve queues in order, FIFO inside each, each job at its requested size."""
        del now  # priority depends on attained service, which the views carry
        for job in jobs:
            if job.size and job.size != job.spec.max_procs:
                raise ValueError(f"job {job.job_id!r} holds {job.size} processes; this policy "
                                 f"runs jobs only at their requested size {job.spec.max_procs}")
        order = sorted(jobs, key=lambda j: (self.queue(j), j.spec.submit_time, j.job_id))
        return place_rigid(order, cluster, stop_at_first=False)
