"""What crossing ranks costs at N processes: the collectives' work, the time a rank sleeps
in them, and the wait for the last rank.

A collective costs a rank two things that scale differently:

- **Work**: the bytes' CPU work, b buckets of n buffer bytes on N ranks,

      2(N-1)/N x n / link rate + n / copy rate       sent through loopback (and reduced),
                                                    copied into and out of the bucket

  gloo's threads do it inside the rank's process, so on a CPU host it is core-seconds
  like the forward's: it takes the rank's share of a core, and the run's process CPU
  counts it. On CUDA the bytes cross the device link instead: wire time, not host work.
- **Sleep**: the ring's 2(N-1) hops per bucket, each a message and a wake-up, and beside
  D foreign threads on C cores a wake to a busy core (wake x D / C per bucket). A
  sleeping rank uses no core; the other ranks meet it in the same collective, so the
  cores idle (unless foreign threads take them). On a CPU host a step above one rank
  also sleeps a fixed `step_wake_s` that does not grow with the hops: the idle time of
  DDP's step, against the same work in two independent processes, beyond what the
  prior's hops explain (docs/benchmarks.md, the scaling model).

A multi-process run fits the hop latency to what its ranks slept per step less their
wait (`scaling_model` reads the sleep off the run's CPU accounting): a hop inside a real
step costs more than the calibrated probe's (DDP's hook and future, an optimizer's own
collective if it has one), and all of it grows with the hops. Less sleep than the probe
explains means backward hid the rest (the exposure). A one-process run uses priors, as
do the bytes' rates unless the run calibrated its link. The priors for a CPU host are
from runs of the examples on a small host (gloo over loopback, DDP with one gradient
bucket): the link's beside other jobs, not the runs the model is checked against; the
fixed sleep from an independent pair of processes; the scheduler's share of the arrival
spread from two sets of the benchmark's runs, checked since on a later set (the figures:
docs/benchmarks.md, the scaling model).

The wait for the last rank: ranks reach the collective spread as sigma x N standard
normals in core-seconds (sigma: a fraction of the work before the collective, and on a
saturated host a further fraction: that work is cut into timeslices among the other
runnable threads). Measured, that spread is a similar share of the work on both
examples, whose steps differ sixfold, and a larger one where ranks share cores
(docs/benchmarks.md, the scaling model). With a core each the step
waits sigma x E[max]. Sharing cores, a rank that arrived sleeps and its share goes to the
threads still runnable: k ranks left beside D foreign threads run at min(1, C / (k + D))
each, so the gaps between later arrivals shrink (`wait_units`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from statistics import NormalDist

# Priors (where the CPU figures come from: docs/benchmarks.md, the scaling model). CPU:
# gloo over loopback; CUDA: NCCL within one node.
CPU_LINK = {"hop_latency_s": 150e-6, "link_bytes_per_s": 2**30, "wake_s": 5e-3,
            "local_bytes_per_s": 2e9, "step_wake_s": 0.7e-3}
# CPU through the host's shared memory (`parallel.host_allreduce`): no sockets and no
# threads to wake, a round costs a write, the peers' counters and a sum of their slots.
# The calibration probe's latency on this path is taken as two "hops" a round, its
# bandwidth as the buffer's bytes.
SHM_HOP_S = 7.5e-6
SHM_BYTES_PER_S = 5e9
SHM_LINK = {"hop_latency_s": SHM_HOP_S, "link_bytes_per_s": SHM_BYTES_PER_S,
            "wake_s": CPU_LINK["wake_s"], "local_bytes_per_s": CPU_LINK["local_bytes_per_s"],
            "step_wake_s": 0.0}
CUDA_LINK = {"hop_latency_s": 20e-6, "link_bytes_per_s": 20e9, "wake_s": 0.0,
             "local_bytes_per_s": 200e9, "step_wake_s": 0.0}
# A rank's arrival spread: this fraction of its work, and on a saturated host this much
# more of it (the median of the benchmark's 4-process runs, less the first).
JITTER_PER_WORK = 0.01
JITTER_SCHEDULED = 0.055


@cache
def expected_order(i: int, n: int) -> float:
    """E[i-th smallest] of n independent standard normals (1 <= i <= n)."""
    if n <= 1:
        return 0.0
    unit, steps, lo, hi = NormalDist(), 2000, -8.0, 8.0
    width = (hi - lo) / steps
    # log(n! / ((i-1)! (n-i)!)): the count itself overflows a float past ~1000 ranks.
    log_ways = math.lgamma(n + 1) - math.lgamma(i) - math.lgamma(n - i + 1)
    total = 0.0
    for k in range(steps + 1):
        x = lo + k * width
        below = unit.cdf(x)
        if not 0.0 < below < 1.0:
            continue  # the density of the order statistic is 0 (to double precision) here
        weight = 0.5 if k in (0, steps) else 1.0
        log_density = (log_ways + math.log(unit.pdf(x)) + (i - 1) * math.log(below)
                       + (n - i) * math.log1p(-below))
        total += weight * x * math.exp(log_density)
    return total * width


def cpu_share(n: int, cores: int, background: float) -> float:
    """The share of a core each of n CPU-bound ranks gets beside `background` threads."""
    return min(1.0, cores / (n + max(0.0, background)))


def saturation(n: int, cores: int, background: float) -> float:
    """0 while every runnable thread has a core, rising to 1 at twice as many."""
    return min(1.0, max(0.0, (n + max(0.0, background)) / cores - 1.0))


@cache
def wait_units(n: int, cores: int, background: float) -> tuple[float, float]:
    """(the step's cost, each rank's mean measured wait) of an arrival spread of one
    core-second, for n ranks beside `background` threads on `cores` (see the module
    docstring): arrival k+1 follows arrival k by the normals' gap at the share of the
    n - k ranks still working."""
    if n <= 1:
        return 0.0, 0.0
    background = max(0.0, background)
    arrival = expected_order(1, n) / cpu_share(n, cores, background)
    arrivals = [arrival]
    for k in range(1, n):
        gap = expected_order(k + 1, n) - expected_order(k, n)
        arrival += gap / cpu_share(n - k, cores, background)
        arrivals.append(arrival)
    return arrival, arrival - sum(arrivals) / n


@dataclass(frozen=True, kw_only=True)
class CommModel:
    """A step's collectives at any size (see the module docstring)."""

    buffer_bytes: float
    buckets: float
    hop_latency_s: float
    link_bytes_per_s: float
    wake_s: float
    local_bytes_per_s: float
    step_wake_s: float = 0.0
    """Sleep per step at more than one rank that does not grow with the hops."""
    bytes_on_host: bool = True
    """CPU: the bytes are the rank's work; CUDA: they are wire time (sleep)."""
    exposure: float = 1.0
    """Fraction of the sleep not hidden behind backward."""
    fitted: bool = False
    """Fitted to a run's measured sleep (else: priors only)."""

    def bytes_seconds(self, n: int) -> float:
        """Seconds of the bytes per step at n ranks (core-seconds on a CPU host)."""
        if n <= 1:
            return 0.0
        sent = 2 * (n - 1) / n * self.buffer_bytes
        return sent / self.link_bytes_per_s + self.buffer_bytes / self.local_bytes_per_s

    def faster(self, factor: float) -> CommModel:
        """The model whose bytes take `factor` (<= 1) of the time."""
        if factor <= 0:
            return replace(self, link_bytes_per_s=math.inf, local_bytes_per_s=math.inf)
        return replace(self, link_bytes_per_s=self.link_bytes_per_s / factor,
                       local_bytes_per_s=self.local_bytes_per_s / factor)

    def work(self, n: int) -> float:
        """Core-seconds of host work per step at n ranks (0 on CUDA)."""
        return self.bytes_seconds(n) if self.bytes_on_host else 0.0

    def sleep(self, n: int, background: float, cores: int) -> float:
        """Seconds a rank sleeps in the collectives per step at n ranks."""
        if n <= 1:
            return 0.0
        hops = self.buckets * 2 * (n - 1) * self.hop_latency_s
        wake = self.buckets * self.wake_s * max(0.0, background) / cores
        wire = 0.0 if self.bytes_on_host else self.bytes_seconds(n)
        return self.step_wake_s + self.exposure * (hops + wake + wire)


def comm_model(*, world: int, device: str, buffer_bytes: float, buckets: float,
               latency_s: float | None, allreduce_bytes_per_s: float | None,
               backward_s: float, cores: int, background: float,
               share: float, shared_memory: bool = False) -> CommModel:
    """The run's collectives before `fit_sleep`: the calibrated link where the run has one
    (`share`: the share of a core each rank had while the probe ran), else priors (CPU:
    gloo's, or `shared_memory`'s); a one-process run's buckets overlap the backward."""
    on_host = device != "cuda"
    link = dict((SHM_LINK if shared_memory else CPU_LINK) if on_host else CUDA_LINK)
    if world > 1 and latency_s is not None and allreduce_bytes_per_s:
        link["hop_latency_s"] = latency_s / (2 * (world - 1))
        # The probe's wall rate; on a host, its ranks' work ran at `share` of a core.
        rate = allreduce_bytes_per_s * 2 * (world - 1) / world
        link["link_bytes_per_s"] = rate / share if on_host else rate
    model = CommModel(buffer_bytes=buffer_bytes, buckets=buckets, bytes_on_host=on_host,
                      **link)
    if world > 1 or model.buckets <= 1:
        return model
    # The last bucket's collective is exposed; the earlier ones sleep behind the backward
    # that follows them, as far as it lasts (judged at 2 ranks). The step's fixed sleep
    # comes after the last of them and is not hidden.
    total = model.sleep(2, background, cores) - model.step_wake_s
    earlier = total * (model.buckets - 1) / model.buckets
    hidden = min(earlier, backward_s * (model.buckets - 1) / model.buckets)
    exposure = max(1.0 / model.buckets, 1.0 - hidden / total) if total > 0 else 1.0
    return replace(model, exposure=exposure)


def fit_sleep(model: CommModel, world: int, slept: float, cores: int,
              background: float) -> CommModel:
    """The model that sleeps what the run slept per step at `world` > 1 ranks: the fixed
    part first (no more than was slept), the excess over the calibrated (or prior) hops
    spread over the hops; less than they explain: backward hid the rest."""
    model = replace(model, step_wake_s=min(model.step_wake_s, max(0.0, slept)))
    expected = model.sleep(world, background, cores)
    if slept >= expected:
        hops = model.buckets * 2 * (world - 1)
        return replace(model, hop_latency_s=model.hop_latency_s + (slept - expected) / hops,
                       fitted=True)
    rest = expected - model.step_wake_s
    exposure = model.exposure * (slept - model.step_wake_s) / rest if rest > 0 else 1.0
    return replace(model, exposure=exposure, fitted=True)


@dataclass(frozen=True, kw_only=True)
class WaitModel:
    """The wait for the last rank to reach the collective, from its arrival spread."""

    per_work: float = JITTER_PER_WORK
    scheduled: float = JITTER_SCHEDULED
    """The further fraction of the work on a saturated host."""

    def sigma(self, n: int, work_s: float, cores: int, background: float) -> float:
        """The arrival spread (core-seconds) of n ranks doing `work_s` core-seconds
        before the collective."""
        return (self.per_work + self.scheduled * saturation(n, cores, background)) * work_s

    def cost(self, n: int, work_s: float, cores: int, background: float) -> float:
        """Seconds the step takes longer for the spread, at n ranks."""
        return self.sigma(n, work_s, cores, background) * wait_units(n, cores, background)[0]


def wait_model(*, world: int, sync_wait_s: float, work_s: float, cores: int,
               background: float) -> WaitModel:
    """Priors, fitted to the run's measured wait when it had several ranks: the
    scheduler's part first (while its prior explains no more than the run waited), the
    rest is the work's. A run on an unsaturated host cannot see the scheduler's part:
    its prior stands."""
    prior = WaitModel()
    if world <= 1:
        return prior
    units = wait_units(world, cores, background)[1]
    scheduled = prior.scheduled * saturation(world, cores, background) * work_s * units
    if sync_wait_s < scheduled:
        return WaitModel(per_work=0.0, scheduled=prior.scheduled * sync_wait_s / scheduled)
    worked = prior.per_work * work_s * units
    per_work = prior.per_work * (sync_wait_s - scheduled) / worked if worked > 0 else 0.0
    return WaitModel(per_work=per_work, scheduled=prior.scheduled)
