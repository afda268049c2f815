"""The job model: what a user submits (JobSpec) and what a policy sees of it (JobView)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.throughput import ThroughputModel

# One allocation: the node index of each of a job's processes, sorted (length = size).
Placement = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """The batch sizes a job can run: per-process micro-batch bounds and the global maximum."""

    min_local: int = 1
    """Smallest per-process micro-batch worth running."""
    max_local: int = 1 << 30
    """Largest per-process micro-batch that fits in memory; more is gradient accumulation."""
    max_batch: int = 1 << 30
    """Largest global batch the job may use (where its efficiency is still known)."""

    def __post_init__(self) -> None:
        if self.min_local < 1:
            raise ValueError(f"min_local: {self.min_local} is not allowed; need >= 1")
        if self.max_local < self.min_local:
            raise ValueError(f"max_local: {self.max_local} is below min_local "
                             f"{self.min_local}; need max_local >= min_local")
        if self.max_batch < self.min_local:
            raise ValueError(f"max_batch: {self.max_batch} is below min_local "
                             f"{self.min_local}; need max_batch >= min_local")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A submitted training job: when, how many processes it accepts, its batch contract."""

    job_id: str
    """Unique name of the job."""
    submit_time: float
    """Submission time, seconds since the start of the schedule."""
    min_procs: int = 1
    """Fewest processes the job runs on once started (a preempted job has none)."""
    max_procs: int = 1
    """Most processes the job accepts; a rigid job has min_procs == max_procs."""
    batch_size: int = 1
    """The global batch the user asked for (the base batch of its learning-rate recipe)."""
    adapt_batch: bool = False
    """Whether the job lets the scheduler grow its global batch for goodput."""
    priority: int = 0
    """Larger is admitted first by the goodput policy (FIFO and Tiresias order by time)."""
    limits: BatchLimits = field(default_factory=BatchLimits)
    """Micro-batch and global batch bounds."""
    application: str = ""
    """Kind of job (trace name in simulation); informational for policies."""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("job_id: empty; every job needs a unique name")
        if self.min_procs < 1:
            raise ValueError(f"min_procs: {self.min_procs} for job {self.job_id!r}; need >= 1")
        if self.max_procs < self.min_procs:
            raise ValueError(f"max_procs: {self.max_procs} for job {self.job_id!r} is below "
                             f"min_procs {self.min_procs}; need MIN <= MAX")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: {self.batch_size} for job {self.job_id!r}; need >= 1")
        if self.submit_time < 0 or not math.isfinite(self.submit_time):
            raise ValueError(f"submit_time: {self.submit_time} for job {self.job_id!r}; "
                             "need a finite time >= 0")

    @property
    def rigid(self) -> bool:
        """Whether the job runs only at one size."""
        return self.min_procs == self.max_procs


@dataclass(frozen=True, kw_only=True)
class JobView:
    """What a policy knows of one active job at one moment (all measured, nothing live)."""

    spec: JobSpec
    placement: Placement = ()
    """Current allocation (node of each process); empty when queued or preempted."""
    attained_service: float = 0.0
    """Process-seconds the job has held so far (restart delays included)."""
    started: bool = False
    """Whether the job has ever run."""
    restarts: int = 0
    """Times the job was restarted (resized, moved or resumed) after its first start."""
    restart_delay: float = 30.0
    """Measured seconds a restart costs this job (stop, relaunch, resume to first step)."""
    progress: float = 0.0
    """Fraction of the job done, when known (0 when not): its steps so far over the steps
    it was asked for (the simulator: its progress over the trace's)."""
    throughput: ThroughputModel | None = None
    """Step-time model fitted to the job's own measurements; None before any."""
    efficiency: EfficiencyModel | None = None
    """Statistical efficiency from the job's latest gradient noise scale; None before any."""
    max_measured_procs: int = 0
    """Largest process count the job has been measured at."""
    running_since: float | None = None
    """When the job's current placement started training (schedule clock); None when it
    holds nothing or nobody tracks it."""

    @property
    def job_id(self) -> str:
        """The job's name."""
        return self.spec.job_id

    @property
    def size(self) -> int:
        """Processes the job holds now."""
        return len(self.placement)

    def age(self, now: float) -> float:
        """Seconds since submission."""
        return max(0.0, now - self.spec.submit_time)

    def remaining(self) -> float | None:
        """Estimated seconds left to a running job at its current size: its service so
        far per process times (1 - progress) / progress. None when the job holds nothing
        or its progress is unknown. Exact for a job that ran at one size at a steady rate;
        restart delays in the service lengthen it, earlier sizes bend it either way."""
        if not self.size or not 0.0 < self.progress <= 1.0:
            return None
        return self.attained_service / self.size * (1.0 - self.progress) / self.progress
