"""Candidates sized from a job's measurements (`measure.Measured`), each with its reason.

=============  ===========================================================================
family         proposed when, and at what size
=============  ===========================================================================
batch          accumulation > 1 that memory does not require: the largest micro-batch that
               divides the per-rank batch and fits. CPU: every rank's resident memory at
               the larger batch, estimated as fixed + k x (measured - fixed) (k the growth
               of the micro-batch, fixed the tuner's own resident memory: the same
               libraries, no batch), must stay under (1 - MEMORY_HEADROOM) of the memory
               available now. GPU: held + k x (peak - held) under (1 - MEMORY_HEADROOM)
               of the device (held: memory allocated between steps).
threads        processes x threads > cores (oversubscribed): cores // processes; or fewer
               threads than that on a compute-bound job with cores idle.
cadence        an evaluation, checkpoint or logging cost over CADENCE_SHARE of the wall
               time per step: the cadence (a 1-2-5 number of steps) at which it costs
               CADENCE_TARGET.
data           data wait over DATA_SHARE of the step: the workers that hide the measured
               loading time behind the rest of the step (ceil(load / rest) + 1, at most
               MAX_WORKERS_PER_CORE per core: loaders often wait on storage) and, when more
               than the free cores allow, also the free cores' worth.
bucket         DDP with more than one bucket whose buckets are latency-bound (smaller than
               BUCKET_LATENCY_MULTIPLE x latency x bandwidth bytes) and whose latency
               saving is over min_gain of the step: BUCKET_TARGET_MULTIPLE x latency x
               bandwidth, at most the whole gradient.
=============  ===========================================================================

Where the measurements give it, a candidate carries its predicted speed-up (wall time
per step before over after, counting only the cost it removes); it is a prediction,
checked by the trial, never a decision.
"""

from __future__ import annotations

import math
from typing import Any

import psutil

from tandem.parallel import registry as strategies
from tandem.tune.measure import Measured
from tandem.tune.space import Candidate, _ddp

MEMORY_HEADROOM = 0.2
CADENCE_SHARE = 0.05
CADENCE_TARGET = 0.01
DATA_SHARE = 0.10
MAX_WORKERS_PER_CORE = 4  # loaders that wait on storage, not on a core
BUCKET_LATENCY_MULTIPLE = 2.0
BUCKET_TARGET_MULTIPLE = 8.0
MAX_SAVED_SHARE = 0.9  # a saving of at most this share of the step: predictions <= 10x
MIB = 2.0 ** 20


def nice_ceil(x: float) -> int:
    """The smallest 1-2-5 number (1, 2, 5, 10, 20, ...) >= x."""
    if x <= 1:
        return 1
    scale = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * scale >= x - 1e-9:
            return int(m * scale)
    return int(10 * scale)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def micro_batch(m: Measured, fixed_bytes: float | None = None) -> list[Candidate]:
    """The largest micro-batch memory allows, when the job accumulates without need."""
    if m.accum <= 1 or not m.micro or m.config.get("train.batch_ramp"):
        return []
    per_rank = m.micro * m.accum
    sizes = sorted((d for d in range(m.micro + 1, per_rank + 1) if per_rank % d == 0),
                   reverse=True)
    for size in sizes:
        k = size / m.micro
        fits, why = _fits(m, k, fixed_bytes)
        if fits:
            passes = per_rank // size
            return [Candidate(
                {"train.micro_batch": size}, "batch",
                f"{m.accum} accumulation passes of {m.micro} samples per step that memory "
                f"does not require: {why}; micro-batch {size} ({passes} pass"
                f"{'es' if passes > 1 else ''})")]
    return []


def _fits(m: Measured, k: float, fixed_bytes: float | None) -> tuple[bool, str]:
    limit = 1 - MEMORY_HEADROOM
    if m.on_gpu and m.cuda_peak and m.cuda_total:
        held = m.cuda_allocated if m.cuda_allocated is not None else 0.0
        need = held + k * max(0.0, m.cuda_peak - held)
        return need <= limit * m.cuda_total, (
            f"device peak {_gib(m.cuda_peak)} would be ~{_gib(need)} of {_gib(m.cuda_total)}")
    if m.rss_bytes is None or m.available_bytes is None:
        return False, "memory was not measured"
    fixed = min(fixed_bytes if fixed_bytes is not None
                else psutil.Process().memory_info().rss, 0.9 * m.rss_bytes)
    need = m.world * (fixed + k * (m.rss_bytes - fixed))
    return need <= limit * m.available_bytes, (
        f"{m.world} x {_gib(m.rss_bytes)} resident would be ~{_gib(need)} of "
        f"{_gib(m.available_bytes)} available")


def threads(m: Measured) -> list[Candidate]:
    """Threads per process against the cores: never more than the cores hold."""
    fair = max(1, m.cpus // max(m.world, 1))
    if m.world * m.threads > m.cpus:
        return [Candidate({"plan.threads": fair}, "threads",
                          f"{m.world} process(es) x {m.threads} threads on {m.cpus} cores: "
                          f"oversubscribed; {fair} per process")]
    compute_share = (m.compute_s or 0.0) / m.step_s if m.step_s else 0.0
    if m.threads < fair and compute_share > 0.5:
        return [Candidate({"plan.threads": fair}, "threads",
                          f"compute is {compute_share:.0%} of the step on {m.threads} "
                          f"thread(s) per process with {m.cpus - m.world * m.threads} "
                          f"core(s) idle; {fair} per process")]
    return []


def _wall_per_step(m: Measured) -> float | None:
    if not m.step_s:
        return None
    wall = m.step_s
    if m.log_s is not None and m.log_every:
        wall += m.log_s / m.log_every
    for cost, every in ((m.eval_s, m.config.get("train.eval_every")),
                        (m.checkpoint_s, m.config.get("checkpoint.every"))):
        if cost is not None and every:
            wall += cost / int(every)
    return wall


def cadence(m: Measured) -> list[Candidate]:
    """Evaluation, checkpoint and logging cadences whose measured cost is too high."""
    wall = _wall_per_step(m)
    if wall is None or m.step_s is None:
        return []
    out = []
    multiple = (int(m.config.get("plan.sync_every") or 1)
                if m.config.get("plan.strategy") in strategies.names("meets_every") else 1)
    for key, cost, every, what in (
            ("train.eval_every", m.eval_s, int(m.config.get("train.eval_every") or 0),
             "an evaluation"),
            ("checkpoint.every", m.checkpoint_s, int(m.config.get("checkpoint.every") or 0),
             "a checkpoint"),
            ("monitor.log_every", m.log_s, m.log_every, "closing a logging window")):
        if cost is None or not every or cost / every <= CADENCE_SHARE * wall:
            continue
        if key == "monitor.log_every" and int(m.config.get(key) or 0) != every:
            continue  # the trials logged at the tuner's cadence, not the job's
        new = nice_ceil(cost / (CADENCE_TARGET * m.step_s))
        if key == "checkpoint.every":
            new = math.ceil(new / multiple) * multiple
        if new <= every:
            continue
        saved = cost / every - cost / new
        out.append(Candidate(
            {key: new}, "cadence",
            f"{what} costs {cost * 1e3:.3g} ms every {every} step(s): "
            f"{cost / every / wall:.0%} of the wall time per step; every {new} steps it "
            f"costs ~{cost / new / wall:.0%}", predicted=wall / (wall - saved)))
    return out


def data_workers(m: Measured) -> list[Candidate]:
    """Loader workers that hide the measured loading time, within the free cores."""
    if not m.step_s or m.data_s is None or m.data_s <= DATA_SHARE * m.step_s:
        return []
    workers = int(m.config.get("data.workers") or 0)
    rest = max(m.step_s - m.data_s, 1e-4)
    predicted = m.step_s / rest
    cap = max(1, MAX_WORKERS_PER_CORE * m.cpus // max(m.world, 1))
    if workers == 0:
        needed = math.ceil(m.data_s / rest) + 1
    else:  # the pipeline's rate grows with the workers: scale it to the step
        needed = math.ceil(workers * m.step_s / rest) + 1
    free = max(1, (m.cpus - m.world * m.threads) // max(m.world, 1))
    sizes = sorted({min(needed, cap), min(needed, free)} - {workers}, reverse=True)
    why = (f"data wait {m.data_s * 1e3:.3g} ms of a {m.step_s * 1e3:.3g} ms step with "
           f"{workers} worker(s); the rest of the step takes {rest * 1e3:.3g} ms")
    out = [Candidate({"data.workers": w}, "data",
                     f"{why}: {w} worker(s) per rank"
                     + (" (the free cores' worth)" if w == free and w < needed else ""),
                     predicted=predicted) for w in sizes if w > workers]
    if workers > 0:
        prefetch = int(m.config.get("data.prefetch") or 2)
        out.append(Candidate({"data.prefetch": 2 * prefetch}, "data",
                             f"{why}: {2 * prefetch} batches ahead per worker",
                             predicted=predicted))
    return out


def bucket(m: Measured, min_gain: float) -> list[Candidate]:
    """A DDP bucket size no longer latency-bound, when the latency saved is worth it."""
    if (not _ddp(m.config, m.world) or m.config.get("plan.comm_hook", "none") != "none"
            or None in (m.latency_s, m.bandwidth, m.grad_bytes, m.buckets, m.step_s)):
        return []
    assert m.latency_s is not None and m.bandwidth is not None  # for the type checker
    assert m.grad_bytes is not None and m.buckets is not None and m.step_s is not None
    link = m.latency_s * m.bandwidth  # bytes whose transfer takes as long as the latency
    size = float(m.config.get("plan.bucket_mb") or 25.0) * MIB
    if m.buckets <= 1 or m.grad_bytes <= size or size >= BUCKET_LATENCY_MULTIPLE * link:
        return []
    new = min(m.grad_bytes, max(size, BUCKET_TARGET_MULTIPLE * link))
    new_mb = math.ceil(new / MIB * 10) / 10
    buckets = math.ceil(m.grad_bytes / (new_mb * MIB)) + 1  # DDP's first bucket is small
    # The calibrated latency times the all-reduces can exceed the step (they overlap the
    # backward, and a loaded machine inflates the calibration): at most most of the step.
    saved = min(max(0.0, m.buckets - buckets) * m.latency_s, MAX_SAVED_SHARE * m.step_s)
    if saved <= min_gain * m.step_s or new_mb * MIB <= size:
        return []
    return [Candidate(
        {"plan.bucket_mb": new_mb}, "comm",
        f"{m.buckets:.0f} buckets of {size / MIB:.3g} MiB for {m.grad_bytes / MIB:.3g} MiB of "
        f"gradient: each under {BUCKET_LATENCY_MULTIPLE:g} x latency x bandwidth "
        f"({m.latency_s * 1e3:.3g} ms x {m.bandwidth / MIB:.0f} MiB/s = {link / MIB:.3g} MiB), "
        f"latency-bound; {new_mb:g} MiB buckets save ~{saved * 1e3:.3g} ms of latency per step",
        predicted=m.step_s / max(m.step_s - saved, 1e-9))]


def proposals(m: Measured, min_gain: float) -> list[Candidate]:
    """Every measured candidate: misconfigurations first (batch, threads, cadence), then
    the input pipeline and the buckets."""
    out: list[Candidate] = []
    for make in (micro_batch, threads, cadence, data_workers):
        out += make(m)
    out += bucket(m, min_gain)
    return out


def describe(m: Measured) -> dict[str, Any]:
    """The measurements behind the proposals, JSON-ready, for the decision record."""
    names = ("world", "cpus", "threads", "step_s", "data_s", "compute_s", "comm_s",
             "latency_s", "bandwidth", "grad_bytes", "buckets", "rss_bytes",
             "available_bytes", "cuda_peak", "cuda_total", "eval_s", "checkpoint_s", "log_s",
             "log_every")
    out = {n: getattr(m, n) for n in names if getattr(m, n) is not None}
    out.update(micro_batch=m.micro, accumulation=m.accum)
    return out
