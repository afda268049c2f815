"""Configuration smells: settings that are wrong for this job on this machine, read from
one measured run (`measure.Measured`), each with the change that removes it (its
control: the trial that checks it) and the gain it predicts.

==========================  ==============================================================
smell                       fires when (fix; predicted speed-up, c = compute share of step)
==========================  ==============================================================
half-precision-on-cpu       precision.mode fp16/bf16 on a CPU whose oneDNN has no fast
                            kernels for that dtype (`fast_half`) (precision.mode fp32;
                            1 / (1 - c (1 - 1/HALF_CPU_SLOWDOWN)))
micro-batch-below-memory    accumulation > 1 that memory does not require
                            (`sizing.micro_batch`: the largest micro-batch that fits;
                            sqrt of its growth: per-pass costs amortised, a prior)
checkpointing-with-memory   plan.activation_checkpointing on, with the run's memory under
                            SPARE_SHARE of what the device (GPU) or host (CPU) has
                            (activation_checkpointing false; 1 / (1 - c RECOMPUTE_SHARE):
                            the recomputed forward is about a quarter of the compute)
workers-for-cheap-data      loader workers for samples that cost nothing to read: a
                            step's samples, timed in one process (`shim.sample_cost`),
                            read in under DATA_SHARE of the step (whatever the data wait:
                            the workers' contention makes one); untimed, a data wait under
                            DATA_SHARE of the step while processes x (threads + workers)
                            exceed the cores (data.workers 0; the larger of the cores'
                            oversubscription and step / (step - data wait + reading),
                            at most MAX_PRIOR)
threads-over-cores          processes x threads > cores (plan.threads = cores // processes;
                            the oversubscription, at most MAX_PRIOR)
bucket-or-hook-misfit       DDP buckets far smaller than the gradient (more than
                            MAX_BUCKETS all-reduces a step: plan.bucket_mb sized to
                            BUCKETS_TARGET buckets), or a compression hook on a gradient
                            under HOOK_MIN_BYTES (plan.comm_hook none); the exposed
                            communication's share, step / (step - comm)
==========================  ==============================================================

A prediction here orders the candidates and is recorded beside the measured gain; it
never decides: the trial's paired runs do. Each smell is tested with a job that has it
and a placebo job that does not (tests/unit/test_tune_smells.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.analyze.diagnosis.finding import Finding
from tandem.tune.measure import Measured
from tandem.tune.sizing import DATA_SHARE, MIB, micro_batch
from tandem.tune.space import Candidate, _ddp

HALF_CPU_SLOWDOWN = 10.0  # a prior: half-precision autocast without fast kernels
RECOMPUTE_SHARE = 0.25  # one more forward of forward + backward (~3 forwards)
SPARE_SHARE = 0.5
MAX_PRIOR = 2.0
MAX_BUCKETS = 32
BUCKETS_TARGET = 4
HOOK_MIN_BYTES = 8 * MIB
LIMITED_ISA = ("SSE41", "SSE42", "AVX", "AVX2")  # ONEDNN_MAX_CPU_ISA with no half kernels
KIND = "config-smell"


@dataclass(frozen=True)
class Smell:
    """One configuration smell: what is wrong, its fix, what the fix should gain."""

    name: str
    message: str
    fix: dict[str, Any]
    predicted: float | None
    evidence: dict[str, Any] = field(default_factory=dict)

    def candidate(self) -> Candidate:
        """The fix as a tuner candidate."""
        return Candidate(dict(self.fix), "smell", f"{self.name}: {self.message}",
                         predicted=self.predicted)

    def finding(self) -> Finding:
        """The smell as a diagnosis finding (its fix in the suggestions)."""
        fix = ", ".join(f"{k} {v}" for k, v in self.fix.items())
        return Finding(KIND, "medium", {"smell": self.name, **self.evidence},
                       f"{self.name}: {self.message} -> {fix}", [fix],
                       predicted_speedup=self.predicted)


def _compute_share(m: Measured) -> float:
    if m.compute_s and m.step_s:
        return min(1.0, m.compute_s / m.step_s)
    return 1.0


def fast_half(dtype: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether this CPU's oneDNN has fast kernels for `dtype` ('fp16' or 'bf16'), as the
    trials would run it (ONEDNN_MAX_CPU_ISA capped at AVX2 or lower: none)."""
    import torch

    env = os.environ if env is None else env
    if env.get("ONEDNN_MAX_CPU_ISA", "").upper() in LIMITED_ISA:
        return False
    check = {"fp16": "_is_mkldnn_fp16_supported", "bf16": "_is_mkldnn_bf16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return False


def half_on_cpu(m: Measured, env: Mapping[str, str] | None = None) -> Smell | None:
    """fp16/bf16 autocast on a CPU without fast kernels for it."""
    mode = str(m.config.get("precision.mode", "fp32"))
    if mode == "fp32" or m.on_gpu or fast_half(mode, env):
        return None
    c = _compute_share(m)
    predicted = 1 / (1 - c * (1 - 1 / HALF_CPU_SLOWDOWN))
    return Smell("half-precision-on-cpu",
                 f"{mode} autocast on a CPU without fast {mode} kernels (compute "
                 f"{c:.0%} of the step)", {"precision.mode": "fp32"}, predicted,
                 {"mode": mode, "compute_share": c})


def small_micro_batch(m: Measured) -> Smell | None:
    """Accumulation that memory does not require (sized by `sizing.micro_batch`)."""
    found = micro_batch(m)
    if not found:
        return None
    size = int(found[0].changes["train.micro_batch"])
    growth = size / m.micro
    return Smell("micro-batch-below-memory", found[0].reason, dict(found[0].changes),
                 math.sqrt(growth), {"micro_batch": m.micro, "accumulation": m.accum,
                                     "proposed": size})


def _memory_share(m: Measured) -> float | None:
    if m.on_gpu and m.cuda_peak and m.cuda_total:
        return m.cuda_peak / m.cuda_total
    if m.rss_bytes and m.available_bytes:
        return m.world * m.rss_bytes / (m.available_bytes + m.world * m.rss_bytes)
    return None


def checkpointing_to_spare(m: Measured) -> Smell | None:
    """Activation checkpointing on, with memory to spare."""
    share = _memory_share(m)
    if not m.config.get("plan.activation_checkpointing") or share is None:
        return None
    if share >= SPARE_SHARE:
        return None
    c = _compute_share(m)
    return Smell("checkpointing-with-memory",
                 f"activation checkpointing recomputes the forward while the run uses "
                 f"{share:.0%} of the memory", {"plan.activation_checkpointing": False},
                 1 / (1 - c * RECOMPUTE_SHARE), {"memory_share": share,
                                                 "compute_share": c})


def workers_for_cheap_data(m: Measured) -> Smell | None:
    """Loader workers for samples that cost nothing to read.

    When the training set's samples were timed (`Measured.sample_s`, read in one process
    before the session), that decides: reading a step's samples in the training process
    itself would take under DATA_SHARE of the step, so the workers only take cores (and
    the data wait they show is their own contention, not loading). Otherwise the data
    wait must be under DATA_SHARE of the step while the workers oversubscribe the cores.
    """
    workers = int(m.config.get("data.workers") or 0)
    if workers <= 0 or not m.step_s or m.config.get("data.in_memory"):
        return None
    load = m.world * (m.threads + workers)
    oversubscribed = load / max(m.cpus, m.world * m.threads)
    data_s = m.data_s or 0.0
    if m.sample_s is not None:
        serial = m.per_rank * m.sample_s  # a step's samples read by the rank itself
        if serial > DATA_SHARE * m.step_s:
            return None
        own = m.step_s / max(m.step_s - data_s + serial, 1e-9)
        predicted = min(MAX_PRIOR, max(oversubscribed, own))
        why = (f"its samples take {serial / m.step_s:.1%} of the step to read "
               f"({m.sample_s * 1e6:.3g} us each) while the data wait is "
               f"{data_s / m.step_s:.0%}")
    else:
        if m.data_s is None or m.data_s > DATA_SHARE * m.step_s or load <= m.cpus:
            return None
        predicted = min(MAX_PRIOR, oversubscribed)
        why = f"the data waits {data_s / m.step_s:.0%} of the step"
    if predicted <= 1.0:
        return None
    return Smell("workers-for-cheap-data",
                 f"{workers} loader worker(s) per rank for data that costs nothing: {why}; "
                 f"{m.world} x ({m.threads} + {workers}) processes and threads on "
                 f"{m.cpus} cores", {"data.workers": 0}, predicted,
                 {"workers": workers, "data_share": data_s / m.step_s,
                  "sample_s": m.sample_s})


def threads_over_cores(m: Measured) -> Smell | None:
    """More threads than cores."""
    load = m.world * m.threads
    if load <= m.cpus:
        return None
    fair = max(1, m.cpus // max(m.world, 1))
    return Smell("threads-over-cores",
                 f"{m.world} process(es) x {m.threads} threads on {m.cpus} cores",
                 {"plan.threads": fair}, min(MAX_PRIOR, load / m.cpus),
                 {"threads": m.threads, "cpus": m.cpus})


def bucket_or_hook_misfit(m: Measured) -> Smell | None:
    """DDP buckets far smaller than the gradient, or compression of a small gradient."""
    if not _ddp(m.config, m.world) or not m.step_s:
        return None
    comm = min(m.comm_s or 0.0, 0.9 * m.step_s)
    predicted = m.step_s / (m.step_s - comm) if comm > 0 else None
    hook = str(m.config.get("plan.comm_hook", "none"))
    if hook in ("powersgd", "topk", "fp16", "bf16") and m.grad_bytes is not None \
            and m.grad_bytes < HOOK_MIN_BYTES:
        return Smell("bucket-or-hook-misfit",
                     f"comm_hook {hook} compresses a gradient of "
                     f"{m.grad_bytes / MIB:.3g} MiB", {"plan.comm_hook": "none"}, predicted,
                     {"hook": hook, "grad_bytes": m.grad_bytes})
    if hook == "none" and m.buckets and m.buckets > MAX_BUCKETS and m.grad_bytes:
        new_mb = math.ceil(m.grad_bytes / BUCKETS_TARGET / MIB * 10) / 10
        old_mb = float(m.config.get("plan.bucket_mb") or 25.0)
        if new_mb <= old_mb:
            return None
        return Smell("bucket-or-hook-misfit",
                     f"{m.buckets:.0f} all-reduces a step of {old_mb:g} MiB buckets for "
                     f"{m.grad_bytes / MIB:.3g} MiB of gradient",
                     {"plan.bucket_mb": new_mb}, predicted,
                     {"buckets": m.buckets, "grad_bytes": m.grad_bytes})
    return None


SMELLS: tuple[Callable[[Measured], Smell | None], ...] = (
    half_on_cpu, small_micro_batch, checkpointing_to_spare, workers_for_cheap_data,
    threads_over_cores, bucket_or_hook_misfit)


def smells(m: Measured) -> list[Smell]:
    """Every smell the measured run has, largest predicted gain first."""
    found = [s for check in SMELLS if (s := check(m)) is not None]
    return sorted(found, key=lambda s: -(s.predicted or 0.0))
