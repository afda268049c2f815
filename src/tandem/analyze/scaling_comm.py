"""What crossing ranks costs at N processes: exposed all-reduce time and the sync wait.

Both are fitted to a multi-process run's measurements and fall back to priors for a
one-process run (which cannot measure them). The priors for a CPU host are from runs of
the examples on a 2-core machine beside other jobs (not the runs the model is checked
against): gloo over loopback, DDP with one gradient bucket.

Exposed all-reduce per step, b buckets of n buffer bytes on N ranks beside D foreign
threads on C cores, each rank getting a share s of a core:

    b x 2(N-1) x hop latency                      the ring's hops (calibrated at N0 > 1)
  + b x wake x D / C                              waking to a busy core: the gloo thread
                                                  at the start, the trainer at the end
  + (2(N-1)/N x n / link rate + n / copy rate) / s  the bytes' CPU work: sent through
                                                  loopback, copied into and out of the
                                                  bucket, at the rank's share of a core

A run's measured exposed time beyond what its calibrated link explains is apportioned to
the wake and the copies in proportion to their priors; each then follows its own law.
Sync wait: sigma x E[max of N normals], with sigma = a part proportional to the work
before the collective plus a part from being scheduled on a saturated host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from statistics import NormalDist

# Priors. CPU: gloo over loopback (DESIGN.md: ~0.4 ms for a 0.1 MiB all-reduce on 2
# processes, ~1 GiB/s); CUDA: NCCL within one node.
CPU_LINK = {"hop_latency_s": 150e-6, "link_bytes_per_s": 2**30, "wake_s": 5e-3,
            "local_bytes_per_s": 2e9}
CUDA_LINK = {"hop_latency_s": 20e-6, "link_bytes_per_s": 20e9, "wake_s": 0.0,
             "local_bytes_per_s": 200e9}
# A rank's arrival spread: this fraction of its work, plus this much on a saturated host.
JITTER_PER_WORK = 0.01
JITTER_SCHEDULED_S = 5e-3


@cache
def expected_max(n: int) -> float:
    """E[max] of n independent standard normals (0 for n = 1)."""
    if n <= 1:
        return 0.0
    unit, steps, lo, hi = NormalDist(), 2000, -8.0, 8.0
    width = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * width
        weight = 0.5 if i in (0, steps) else 1.0
        total += weight * x * n * unit.pdf(x) * unit.cdf(x) ** (n - 1)
    return total * width


def cpu_share(n: int, cores: int, background: float) -> float:
    """The share of a core each of n CPU-bound ranks gets beside `background` threads."""
    return min(1.0, cores / (n + max(0.0, background)))


def saturation(n: int, cores: int, background: float) -> float:
    """0 while every runnable thread has a core, rising to 1 at twice as many."""
    return min(1.0, max(0.0, (n + max(0.0, background)) / cores - 1.0))


@dataclass(frozen=True, kw_only=True)
class CommModel:
    """Exposed all-reduce seconds per step at any size (see the module docstring)."""

    buffer_bytes: float
    buckets: float
    hop_latency_s: float
    link_bytes_per_s: float
    wake_s: float
    local_bytes_per_s: float
    exposure: float = 1.0
    """Fraction of the all-reduce not hidden behind backward."""
    fitted: bool = False
    """Fitted to a run's measured exposed time (else: priors only)."""

    def parts(self, n: int, share: float, background: float,
              cores: int) -> tuple[float, float, float]:
        """(hops, wake, bytes) seconds of one step's all-reduces at n ranks."""
        if n <= 1:
            return 0.0, 0.0, 0.0
        hops = self.buckets * 2 * (n - 1) * self.hop_latency_s
        wake = self.buckets * self.wake_s * max(0.0, background) / cores
        sent = 2 * (n - 1) / n * self.buffer_bytes
        work = (sent / self.link_bytes_per_s + self.buffer_bytes / self.local_bytes_per_s)
        return hops, wake, work / share

    def exposed(self, n: int, share: float, background: float, cores: int) -> float:
        """Exposed seconds per step at n ranks."""
        return self.exposure * sum(self.parts(n, share, background, cores))


def comm_model(*, world: int, device: str, buffer_bytes: float, buckets: float,
               latency_s: float | None, allreduce_bytes_per_s: float | None,
               exposed_s: float, backward_s: float, cores: int, background: float,
               share: float) -> CommModel:
    """The run's communication: fitted to its exposed time when it had several ranks
    (`share`: its ranks' share of a core), else priors and the bucket overlap."""
    link = dict(CUDA_LINK if device == "cuda" else CPU_LINK)
    if world > 1 and latency_s is not None and allreduce_bytes_per_s:
        link["hop_latency_s"] = latency_s / (2 * (world - 1))
        link["link_bytes_per_s"] = allreduce_bytes_per_s * 2 * (world - 1) / world
    model = CommModel(buffer_bytes=buffer_bytes, buckets=buckets, **link)
    if world > 1:
        return _fit(model, world, exposed_s, cores, background, share)
    if model.buckets <= 1:
        return model
    # The last bucket's all-reduce is exposed; the earlier ones hide behind the backward
    # that follows them, as far as it lasts (judged at 2 ranks).
    total = model.exposed(2, cpu_share(2, cores, background), background, cores)
    earlier = total * (model.buckets - 1) / model.buckets
    hidden = min(earlier, backward_s * (model.buckets - 1) / model.buckets)
    exposure = max(1.0 / model.buckets, 1.0 - hidden / total) if total > 0 else 1.0
    return replace(model, exposure=exposure)


def _fit(model: CommModel, world: int, measured: float, cores: int, background: float,
         share: float) -> CommModel:
    hops, wake, work = model.parts(world, share, background, cores)
    local = model.buffer_bytes / model.local_bytes_per_s / share
    wire = hops + work - local  # what the calibrated link explains
    if measured >= wire:
        scale = (measured - wire) / (wake + local) if wake + local > 0 else 0.0
        return replace(model, wake_s=model.wake_s * scale,
                       local_bytes_per_s=model.local_bytes_per_s / max(scale, 1e-12),
                       fitted=True)
    # Less exposed than the bare wire: backward hid the rest.
    return replace(model, wake_s=0.0, local_bytes_per_s=math.inf,
                   exposure=measured / wire if wire > 0 else 1.0, fitted=True)


@dataclass(frozen=True, kw_only=True)
class WaitModel:
    """Mean wait per step for the last rank to arrive at the collective."""

    per_work: float = JITTER_PER_WORK
    scheduled_s: float = JITTER_SCHEDULED_S

    def wait(self, n: int, work_s: float, cores: int, background: float) -> float:
        """Seconds per step at n ranks, each doing `work_s` before the collective."""
        sigma = self.per_work * work_s + self.scheduled_s * saturation(n, cores, background)
        return sigma * expected_max(n)


def wait_model(*, world: int, sync_wait_s: float, work_s: float, cores: int,
               background: float) -> WaitModel:
    """Priors, scaled to the run's measured wait when it had several ranks."""
    prior = WaitModel()
    if world <= 1:
        return prior
    expected = prior.wait(world, work_s, cores, background)
    scale = sync_wait_s / expected if expected > 0 else 0.0
    return WaitModel(per_work=prior.per_work * scale, scheduled_s=prior.scheduled_s * scale)
