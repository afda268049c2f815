"""tandem's goodput policy: elastic sizes that maximise goodput with fairness, resizes that pay.

Each call works in three passes over the active jobs:

1. Admission, least attained service first (higher `priority` before that): each job gets
   its minimum size while slots last. When jobs outnumber slots this is LAS, which keeps
   short jobs short. Attained service (process-seconds) counts in bands that double from
   `las_band` (below it, below twice it, below four times it, ...), and inside a band the
   job submitted first goes first, as Tiresias discretises LAS: with the service compared
   exactly, two jobs whose services cross swap places at every decision and each swap pays
   a restart; with bands a job is displaced only by one with less than about half its
   service. A running job with less left than a restart costs it (from its progress,
   when known) comes before every band: preempting it would cost it more than the job
   taking its slots could gain.
2. Growth: the remaining slots go, one upgrade at a time, to the job whose fair utility
   rises most per slot. A job's speedup at size r is its predicted goodput at r (best
   batch, packed placement) over its goodput at the fair share (slots / jobs); utility is
   the power mean's term s**p / p (p = `fairness`, -1 by default as in Pollux: a slot
   helps a job that has little more than one that already has much).
3. Placement: jobs that keep their size keep their slots; the rest are packed onto as few
   nodes as possible, largest first.

A resize must pay for itself: a running job's speedup at any size other than its current
one is discounted by (H - D) / H, where D is the job's measured restart delay and H the
horizon over which the gain is collected: the job's age (a job that has run for T is
expected to run about as long again, the premise of LAS), at least `horizon_min`, at most
`horizon_max` (the next reallocation comes within a few intervals anyway). So a resize
happens only when the predicted gain over H exceeds what D costs. A job that keeps its
size but sits on more nodes than it needs moves onto fewer only on the same terms.

A job's largest size is capped at `explore` times the largest size it was measured at, so
an optimistic model of an unmeasured size is tried one step at a time; a job with no
measurements gets at most `first_size` processes and is assumed to scale linearly.

The defaults of `explore`, `first_size` and `horizon_max` were chosen by a small sweep on
the shipped Pollux workloads at 1.0x load (docs/benchmarks.md says how much they matter).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.sched.policies.cluster import Cluster, place_packed
from tandem.sched.policies.goodput import GoodputModel
from tandem.sched.policies.job import JobView
from tandem.sched.policies.policy import Allocations


@dataclass(frozen=True)
class GoodputPolicy:
    """Maximise the fair sum of predicted goodput; resize only when the gain pays the cost."""

    fairness: float = -1.0
    """Power-mean exponent p of the speedups (1: plain sum; 0: log; < 0: fairer)."""
    explore: float = 4.0
    """A job may grow to at most this times its largest measured size."""
    first_size: int = 2
    """Most processes a job gets before it has measured anything (two processes on one
    node measure compute and synchronisation at once)."""
    horizon_min: float = 60.0
    """Shortest horizon (seconds) over which a resize's gain is collected."""
    horizon_max: float = 180.0
    """Longest horizon (seconds) over which a resize's gain is collected: in a busy
    cluster allocations change again within a few scheduling intervals."""
    las_band: float = 60.0
    """Process-seconds of attained service in the first admission band; each further
    band is twice as wide as all before it."""
    name: str = "goodput"

    def __post_init__(self) -> None:
        if self.explore < 1:
            raise ValueError(f"explore: {self.explore} is not allowed; need >= 1")
        if self.first_size < 1:
            raise ValueError(f"first_size: {self.first_size} is not allowed; need >= 1")
        if not 0 < self.horizon_min <= self.horizon_max:
            raise ValueError(f"horizon_min, horizon_max: {self.horizon_min}, "
                             f"{self.horizon_max}; need 0 < horizon_min <= horizon_max")
        if not self.las_band > 0:
            raise ValueError(f"las_band: {self.las_band} is not allowed; need > 0 "
                             "process-seconds")

    def allocate(self, jobs: Sequence[JobView], cluster: Cluster, now: float) -> Allocations:
        """Sizes by admission and fair goodput growth, then placements (see the module doc)."""
        if not jobs:
            return {}
        fair = max(1, cluster.capacity // len(jobs))
        values = [self.values(job, cluster, now, fair) for job in jobs]
        sizes = self._admit(jobs, cluster.capacity)
        free = cluster.capacity - sum(sizes)
        self._grow(sizes, values, free)
        movers = {i for i, job in enumerate(jobs) if sizes[i] and sizes[i] == job.size
                  and self._spread_loss(job, cluster) < self.keep(job, now)}
        return _place(jobs, sizes, cluster, movers)

    def cap(self, job: JobView, capacity: int) -> int:
        """Largest size the job may get now."""
        if job.throughput is None or job.max_measured_procs < 1:
            explored = self.first_size  # nothing measured yet: start small and learn
        else:
            explored = int(self.explore * job.max_measured_procs)
        explored = max(explored, job.size, job.spec.min_procs)
        return min(job.spec.max_procs, capacity, explored)

    def speedups(self, job: JobView, cluster: Cluster, fair: int) -> np.ndarray:
        """Predicted goodput at sizes 0..cap over goodput at the fair share."""
        top = self.cap(job, cluster.capacity)
        model = _model(job)
        if model is None:
            goodput = np.arange(top + 1, dtype=float)  # unmeasured: linear, optimistic
        else:
            goodput = _curve(model, top, cluster.slots_per_node)
        ref = min(max(fair, job.spec.min_procs), top)
        return goodput / max(goodput[ref], 1e-12)

    def values(self, job: JobView, cluster: Cluster, now: float, fair: int) -> np.ndarray:
        """Utility of each size 0..cap, resize cost included; -inf where not allowed."""
        speed = self.speedups(job, cluster, fair)
        if job.size:
            current = speed[job.size] * self._spread_loss(job, cluster)
            speed = speed * self.keep(job, now)
            speed[job.size] = current
        value = _utility(speed, self.fairness)
        value[1:job.spec.min_procs] = -np.inf
        return value

    def keep(self, job: JobView, now: float) -> float:
        """Share of the horizon left to a running job after it pays a restart."""
        horizon = min(max(job.age(now), self.horizon_min), self.horizon_max)
        return max(horizon - job.restart_delay, 0.0) / horizon

    @staticmethod
    def finishing(job: JobView) -> bool:
        """Whether a running job has less left than a restart would cost it: preempting
        it then loses more (its restart) than the job that takes its slots can gain (the
        time until it ends)."""
        left = job.remaining()
        return left is not None and left <= job.restart_delay

    def _spread_loss(self, job: JobView, cluster: Cluster) -> float:
        """Goodput on the job's actual nodes over goodput packed on the fewest nodes."""
        model = _model(job)
        nodes = len(set(job.placement))
        packed = cluster.min_nodes(job.size)
        if model is None or nodes == packed:
            return 1.0
        return model.best(nodes, job.size).goodput / model.best(packed, job.size).goodput

    def band(self, service: float) -> int:
        """Admission band of an attained service: 0 below `las_band`, then k while below
        las_band * 2**k."""
        if service < self.las_band:
            return 0
        return 1 + int(math.floor(math.log2(service / self.las_band)))

    def _admit(self, jobs: Sequence[JobView], capacity: int) -> list[int]:
        order = sorted(range(len(jobs)), key=lambda i: (
            -jobs[i].spec.priority, not self.finishing(jobs[i]),
            self.band(jobs[i].attained_service),
            jobs[i].spec.submit_time, jobs[i].job_id))
        sizes = [0] * len(jobs)
        free = capacity
        for i in order:
            need = jobs[i].spec.min_procs
            if need <= free:
                sizes[i] = need
                free -= need
        return sizes

    def _grow(self, sizes: list[int], values: list[np.ndarray], free: int) -> None:
        """Give free slots by the best utility gain per slot until no upgrade gains."""
        heap: list[tuple[float, int, int, int]] = []

        def push(i: int) -> None:
            cur, value = sizes[i], values[i]
            if cur == 0 or cur + 1 >= len(value) or free <= 0:
                return
            ahead = value[cur + 1:min(len(value), cur + free + 1)]
            with np.errstate(invalid="ignore"):
                gain = (ahead - value[cur]) / np.arange(1, len(ahead) + 1)
            # -inf - -inf (sizes out of reach, from a size out of reach) gains nothing
            gain[np.isnan(gain)] = -np.inf
            best = int(np.argmax(gain))
            if gain[best] > 1e-12:
                heapq.heappush(heap, (-float(gain[best]), i, cur, cur + best + 1))

        for i in range(len(sizes)):
            push(i)
        while heap and free > 0:
            _, i, cur, target = heapq.heappop(heap)
            if sizes[i] != cur:
                continue  # stale: the job grew since
            if target - cur > free:
                push(i)  # the best step no longer fits: look again within what is free
                continue
            sizes[i] = target
            free -= target - cur
            push(i)


def _utility(speed: np.ndarray, p: float) -> np.ndarray:
    """The power mean's per-job term: s**p / p (log s at p = 0), -inf for nothing."""
    with np.errstate(divide="ignore"):
        if p == 0:
            value = np.log(speed)
        else:
            value = np.where(speed > 0, np.power(np.maximum(speed, 1e-300), p) / p,
                             -np.inf if p < 0 else 0.0)
    value[0] = -np.inf if p <= 0 else 0.0
    return value


_CURVES: dict[tuple[GoodputModel, int, int], np.ndarray] = {}


def _curve(model: GoodputModel, top: int, slots: int) -> np.ndarray:
    """Memoised goodput curve: the models are immutable, so equal inputs give equal curves."""
    key = (model, top, slots)
    curve = _CURVES.get(key)
    if curve is None:
        if len(_CURVES) > 4096:
            _CURVES.clear()
        curve = _CURVES[key] = model.curve(top, slots)
    return curve


def _model(job: JobView) -> GoodputModel | None:
    """The job's goodput model, or None before it has measured itself."""
    if job.throughput is None or job.efficiency is None:
        return None
    return GoodputModel(job.throughput, job.efficiency, job.spec.limits,
                        adapt_batch=job.spec.adapt_batch)


def _place(jobs: Sequence[JobView], sizes: list[int], cluster: Cluster,
           movers: set[int]) -> Allocations:
    """Place jobs: keepers stay, resized ones are packed, spread `movers` consolidate.

    Jobs keeping their size keep their slots. Resized ones are packed, largest first,
    around them. Then each mover (a job that keeps its size but would gain more than a
    restart costs on fewer nodes) releases its slots and is packed again; it takes the
    new placement only if that spans fewer nodes.
    """
    allocations: Allocations = {jobs[i].job_id: jobs[i].placement
                                for i in range(len(jobs)) if sizes[i] and
                                sizes[i] == jobs[i].size}
    free = cluster.free_slots(allocations.values())
    moving = sorted((i for i in range(len(jobs)) if sizes[i] and sizes[i] != jobs[i].size),
                    key=lambda i: (-sizes[i], jobs[i].spec.submit_time, jobs[i].job_id))
    for i in moving:
        placement = place_packed(sizes[i], free)
        assert placement is not None, "sizes were chosen within the free slot count"
        allocations[jobs[i].job_id] = placement
    for i in sorted(movers, key=lambda i: (-sizes[i], jobs[i].spec.submit_time)):
        old = jobs[i].placement
        for node in old:
            free[node] += 1
        new = place_packed(len(old), free)
        assert new is not None, "a job's own released slots are free"
        if len(set(new)) < len(set(old)):
            allocations[jobs[i].job_id] = new
        else:
            for node in new:
                free[node] += 1
            for node in old:
                free[node] -= 1
    return allocations
