"""What the tuner knows about a job before proposing anything: one run's measurements.

Everything here is read from the run store (a run's metric rows and summary) or from
the machine the trials run on (cores, available memory); nothing is assumed. The search
space (`space.py`) turns these figures into candidates, each with the numbers that
justify it.

Costs outside the step are attributed from the logging windows' closing times: a
window's wall-clock gap to the previous window minus its training time is its overhead.
An evaluation or a checkpoint at step s (after the step, outside the window's training
time) lands in the gap of the window whose closing step is the first one > s. Windows
holding neither give the logging cost of a window (their median overhead).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from tandem.analyze.report.figures import by_name, steady_median
from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_BUCKETS_PER_STEP,
    COMM_BYTES_PER_STEP,
    COMM_LATENCY,
    MEM_CUDA_ALLOCATED,
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    MEM_RSS,
    TIME_CHECKPOINT_BLOCKING,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_STEP,
)
from tandem.tune.stats import WindowFigure, warmup_windows


@dataclass(frozen=True)
class Measured:
    """One run's figures that the search space reasons from (None: not measured)."""

    world: int
    cpus: int  # cores this process may use
    config: dict[str, Any]  # the job's own flat settings (its cadence, its batch split)
    summary: dict[str, Any] = field(default_factory=dict)
    threads: int = 1  # intra-op threads per process the trials run with
    step_s: float | None = None  # median steady seconds per step (training only)
    data_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None  # exposed wire per step
    latency_s: float | None = None  # all-reduce latency (calibration)
    bandwidth: float | None = None  # all-reduce buffer bytes per second (calibration)
    grad_bytes: float | None = None  # gradient buffer all-reduced per step
    buckets: float | None = None  # all-reduces per step
    rss_bytes: float | None = None  # the largest rank's resident memory
    available_bytes: float | None = None  # memory available on the host now
    cuda_peak: float | None = None
    cuda_total: float | None = None
    cuda_allocated: float | None = None  # held between steps (weights, grads, state)
    eval_s: float | None = None  # one evaluation
    checkpoint_s: float | None = None  # what one checkpoint costs the run
    log_s: float | None = None  # what closing one logging window costs the run
    log_every: int = 0  # the logging window the measured run used (its log_s is per one)
    sample_s: float | None = None  # one training sample's read time, in one process

    @property
    def accum(self) -> int:
        """Accumulation passes per step in the measured run (from its settings when its
        summary lacks it: a probe stopped early writes none)."""
        from tandem.tune.space import accumulation

        return int(self.summary.get("accumulation") or accumulation(self.config, self.world)
                   or 1)

    @property
    def micro(self) -> int:
        """Samples per forward/backward on one process in the measured run."""
        if self.summary.get("micro_batch"):
            return int(self.summary["micro_batch"])
        per_rank = self.per_rank
        return int(self.config.get("train.micro_batch") or 0) or per_rank

    @property
    def per_rank(self) -> int:
        """Samples per step on one process (the global batch's share)."""
        return int(self.config.get("train.global_batch", 0)) // max(self.world, 1)

    @property
    def on_gpu(self) -> bool:
        """Whether the job trains on CUDA devices."""
        return self.cuda_total is not None


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def current_threads(config: Mapping[str, Any], env: Mapping[str, str]) -> int:
    """Intra-op threads per process a trial runs with: plan.threads, else OMP_NUM_THREADS
    (what `tandem run` and the trials set: 1 when unset)."""
    threads = int(config.get("plan.threads") or 0)
    if threads > 0:
        return threads
    try:
        return max(1, int(env.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def _job(groups: Mapping[str, Sequence[Mapping[str, Any]]], name: str) -> float | None:
    value = steady_median(groups, name)
    return value if value is not None and math.isfinite(value) else None


def _rss(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> float | None:
    per_rank: dict[int, list[float]] = {}
    for row in groups.get(MEM_RSS, ()):
        if row["rank"] >= 0 and math.isfinite(row["value"]):
            per_rank.setdefault(row["rank"], []).append(row["value"])
    return max((max(v) for v in per_rank.values()), default=None)


def _grad_bytes(groups: Mapping[str, Sequence[Mapping[str, Any]]], world: int) -> float | None:
    sent = _job(groups, COMM_BYTES_PER_STEP)
    if sent is None or world < 2:
        return None
    return sent / (2 * (world - 1) / world)  # a ring all-reduce sends 2(N-1)/N of it


def measured_from(metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                  config: Mapping[str, Any], windows: Sequence[WindowFigure], world: int,
                  log_every: int, env: Mapping[str, str] | None = None) -> Measured:
    """The Measured figures of one run: its metric rows, summary and windows, the job's
    flat settings (`config`) and the logging window the run used (`log_every`)."""
    groups = by_name(metrics)
    costs = cadence_costs(windows, dict(config), dict(summary), groups)
    peak = _job(groups, MEM_CUDA_PEAK)
    return Measured(
        world=world, cpus=cpu_count(), config=dict(config), summary=dict(summary),
        threads=current_threads(config, os.environ if env is None else env),
        step_s=_job(groups, TIME_STEP), data_s=_job(groups, TIME_DATA),
        compute_s=_job(groups, TIME_COMPUTE), comm_s=_job(groups, TIME_COMM_EXPOSED),
        latency_s=_job(groups, COMM_LATENCY),
        bandwidth=_job(groups, COMM_ALLREDUCE_RATE),
        grad_bytes=_grad_bytes(groups, world), buckets=_job(groups, COMM_BUCKETS_PER_STEP),
        rss_bytes=_rss(groups), available_bytes=float(psutil.virtual_memory().available),
        cuda_peak=peak, cuda_total=_job(groups, MEM_CUDA_TOTAL) if peak else None,
        cuda_allocated=_job(groups, MEM_CUDA_ALLOCATED) if peak else None,
        eval_s=costs.get("eval"), checkpoint_s=costs.get("checkpoint"),
        log_s=costs.get("log"), log_every=log_every)


def _events_at(steps: Sequence[int], every: int, last: int) -> list[int]:
    return [s for s in steps if every and s % every == 0 and s != last]


def cadence_costs(windows: Sequence[WindowFigure], config: Mapping[str, Any],
                  summary: Mapping[str, Any],
                  groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, float]:
    """Seconds per evaluation, per checkpoint and per logging window (see the module
    docstring); a key is missing where the run did not measure it."""
    out: dict[str, float] = {}
    steps_run = int(summary.get("steps") or (windows[-1].step if windows else 0))
    eval_every = int(config.get("train.eval_every") or 0)
    evals = (steps_run // eval_every + (1 if steps_run % eval_every else 0)
             if eval_every else 1)
    eval_total = float(summary.get("eval_time_s") or 0.0)
    if eval_total > 0 and evals:
        out["eval"] = eval_total / evals
    every = int(config.get("checkpoint.every") or 0)
    if len(windows) < 3:
        return out
    drop = max(1, warmup_windows([w.samples / w.busy_s for w in windows if w.busy_s > 0]))
    clean, with_ckpt = [], []
    all_steps = range(1, steps_run + 1)
    evals_at = set(_events_at(all_steps, eval_every, steps_run))
    ckpts_at = set(_events_at(all_steps, every, steps_run))
    for before, w in zip(windows[drop - 1:], windows[drop:], strict=False):
        overhead = (w.time - before.time) - w.busy_s
        inside = range(before.step, w.step)  # events after these steps land in this gap
        n_eval = sum(s in evals_at for s in inside)
        n_ckpt = sum(s in ckpts_at for s in inside)
        if not n_eval and not n_ckpt:
            clean.append(overhead)
        elif n_ckpt:
            with_ckpt.append((overhead - n_eval * out.get("eval", 0.0), n_ckpt))
    if clean:
        out["log"] = max(0.0, statistics.median(clean))
    if with_ckpt:
        log_cost = out.get("log", 0.0)
        out["checkpoint"] = max(0.0, statistics.median((o - log_cost) / n
                                                       for o, n in with_ckpt))
    blocking = [r["value"] for r in groups.get(TIME_CHECKPOINT_BLOCKING, ())
                if math.isfinite(r["value"])]
    if blocking and "checkpoint" not in out:
        out["checkpoint"] = statistics.median(blocking)
    return out
