"""The cluster simulator: replays a workload against measured traces under a policy.

Fixed scheduling interval (60 s by default, as Pollux's simulator): every interval all
running jobs advance at their trace speed, finished jobs leave, and the policy is asked
for new allocations. A job whose placement changes pays its restart delay (30 s by
default: stop, relaunch, load the checkpoint) before it trains again, during which it
holds its slots. The policy is the same object the live scheduler calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tandem.sched.policies.cluster import Cluster, check_allocations
from tandem.sched.policies.job import JobSpec
from tandem.sched.policies.policy import Policy
from tandem.sched.simulation.simjob import SimJob
from tandem.sched.simulation.traces import TraceApplication


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated workload."""

    policy: str
    jcts: dict[str, float]
    """Completion time minus submission time of every job, seconds."""
    makespan: float
    """Time the last job finished, seconds from the start of the schedule."""
    restarts: int
    """Restarts after first starts (resizes, moves, resumptions), over all jobs."""
    resizes: int
    """Restarts of a running job at another size (part of `restarts`)."""
    preemptions: int
    """Times a running job was stopped with nothing to run on."""
    wall_s: float
    """Seconds the simulation itself took."""
    per_job_restarts: dict[str, int] = field(default_factory=dict)

    @property
    def mean_jct(self) -> float:
        """Average job completion time, seconds."""
        return sum(self.jcts.values()) / len(self.jcts) if self.jcts else 0.0

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {"policy": self.policy, "mean_jct": self.mean_jct, "makespan": self.makespan,
                "restarts": self.restarts, "resizes": self.resizes,
                "preemptions": self.preemptions,
                "wall_s": self.wall_s, "jcts": self.jcts,
                "per_job_restarts": self.per_job_restarts}


def simulate(specs: Sequence[JobSpec], apps: dict[str, TraceApplication], policy: Policy,
             cluster: Cluster, *, interval: float = 60.0, restart_delay: float = 30.0,
             restart_delays: Mapping[str, float] | None = None,
             max_time: float = 60 * 86400.0) -> SimResult:
    """Run every job of `specs` to completion under `policy`; raise if past `max_time`.

    Every (re)start costs `restart_delay` seconds, or the delay `restart_delays` gives
    the job's application (start-ups measured per kind of job)."""
    if interval <= 0:
        raise ValueError(f"interval: {interval} is not allowed; need > 0")
    delays = dict(restart_delays or {})
    for name, delay in [("restart_delay", restart_delay)] + [
            (f"restart_delays[{app!r}]", d) for app, d in delays.items()]:
        if not delay >= 0:
            raise ValueError(f"{name}: {delay} is not allowed; need >= 0")
    for spec in specs:
        if spec.min_procs > cluster.capacity:
            raise ValueError(f"job {spec.job_id!r}: min_procs {spec.min_procs} exceeds the "
                             f"cluster's {cluster.capacity} slots; it could never run")
        if spec.application not in apps:
            raise ValueError(f"job {spec.job_id!r}: no traces for application "
                             f"{spec.application!r}; known: {sorted(apps)}")
    started = time.perf_counter()
    jobs = [SimJob(spec, apps[spec.application], delays.get(spec.application, restart_delay))
            for spec in sorted(specs, key=lambda s: (s.submit_time, s.job_id))]
    now, arrived, active = 0.0, 0, []
    while arrived < len(jobs) or active:
        if not active:  # idle cluster: jump to the tick after the next submission
            now = max(now, math.ceil(jobs[arrived].spec.submit_time / interval) * interval)
        else:
            for job in active:
                job.advance(now, interval)
            now += interval
        if now > max_time:
            raise ValueError(f"max_time: jobs still unfinished after {max_time:.0f} s")
        active = [j for j in active if j.done_at is None]
        while arrived < len(jobs) and jobs[arrived].spec.submit_time <= now:
            active.append(jobs[arrived])
            arrived += 1
        if active:
            _reschedule(active, policy, cluster, now)
    return SimResult(
        policy=policy.name,
        jcts={j.spec.job_id: j.done_at - j.spec.submit_time for j in jobs
              if j.done_at is not None},
        makespan=max(j.done_at or 0.0 for j in jobs),
        restarts=sum(max(j.restarts, 0) for j in jobs),
        resizes=sum(j.resizes for j in jobs),
        preemptions=sum(j.preemptions for j in jobs),
        wall_s=time.perf_counter() - started,
        per_job_restarts={j.spec.job_id: max(j.restarts, 0) for j in jobs})


def _reschedule(active: list[SimJob], policy: Policy, cluster: Cluster, now: float) -> None:
    """Ask the policy, check its answer, and move every job whose placement changed."""
    allocations = policy.allocate([j.view() for j in active], cluster, now)
    ids = {j.spec.job_id for j in active}
    unknown = set(allocations) - ids
    if unknown:
        raise ValueError(f"policy {policy.name}: allocated unknown jobs {sorted(unknown)}")
    check_allocations(allocations, cluster)
    for job in active:
        new = tuple(allocations.get(job.spec.job_id, ()))
        size = len(new)
        if new and not job.spec.min_procs <= size <= job.spec.max_procs:
            raise ValueError(f"policy {policy.name}: job {job.spec.job_id!r} given {size} "
                             f"processes outside {job.spec.min_procs}..{job.spec.max_procs}")
        if new != job.placement:
            job.reallocate(new, now)
