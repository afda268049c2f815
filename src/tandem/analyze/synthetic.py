"""Plausible synthetic runs, for tests and for trying the report without training.

The figures follow what the trainer writes (names, ranks, one row per logging window)
with the phase shares, stragglers and instabilities the caller asks for.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.analyze import stats
from tandem.monitor.catalogue import (
    EVAL_LOSS,
    GRAD_NORM,
    LOSS,
    LR,
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    MEM_RSS,
    MFU,
    SAMPLES_PER_S,
    STRAGGLER_SCORE,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_H2D,
    TIME_OPTIM,
    TIME_STEP,
    TOKENS_PER_S,
)
from tandem.monitor.store import MetricRow, RunStore
from tandem.parallel.registry import DDP
from tandem.status import RunStatus

DEFAULT_SHARES = {TIME_DATA: 0.05, TIME_H2D: 0.03, TIME_COMPUTE: 0.65,
                  TIME_COMM_EXPOSED: 0.10, TIME_OPTIM: 0.07}


@dataclass(kw_only=True)
class Synthetic:
    """What a synthetic run looks like."""

    steps: int = 300
    log_every: int = 10
    world_size: int = 2
    step_s: float = 0.05
    shares: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))
    global_batch: int = 64
    tokens_per_sample: int = 0
    straggler: int | None = None
    straggler_factor: float = 1.3
    nan_at: int | None = None
    cuda_total_bytes: float | None = None
    cuda_peak_share: float = 0.6
    eval_every: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if self.straggler is not None and not 0 <= self.straggler < self.world_size:
            raise ValueError(f"straggler must be a rank in 0..{self.world_size - 1}; "
                             f"got {self.straggler}")
        if self.steps < self.log_every:
            raise ValueError(f"steps ({self.steps}) must be >= log_every ({self.log_every})")


def _window(spec: Synthetic, rng: random.Random, step: int, now: float) -> list[MetricRow]:
    noise = 1.0 + rng.gauss(0.0, 0.02)
    rank_step = [spec.step_s * noise * (spec.straggler_factor if r == spec.straggler else 1.0)
                 * (1.0 + rng.gauss(0.0, 0.01)) for r in range(spec.world_size)]
    mid = stats.median(rank_step)
    job_step = max(rank_step)  # every rank waits for the slowest at the all-reduce
    progress = step / spec.steps
    loss = 2.3 * math.exp(-3.0 * progress) + 0.1 + rng.gauss(0.0, 0.01)
    if spec.nan_at is not None and step >= spec.nan_at:
        loss = math.nan
    rows: list[MetricRow] = [
        (step, -1, TIME_STEP, job_step, now),
        (step, -1, LOSS, loss, now),
        (step, -1, LR, 1e-3 * min(1.0, progress * 10) * (0.5 + 0.5 * math.cos(
            math.pi * progress)), now),
        (step, -1, GRAD_NORM, 1.5 * math.exp(-progress) + abs(rng.gauss(0.0, 0.05)), now),
        (step, -1, SAMPLES_PER_S, spec.global_batch / job_step, now),
        (step, -1, MFU, 0.35 * spec.step_s / job_step, now),
    ]
    if spec.tokens_per_sample:
        rows.append((step, -1, TOKENS_PER_S,
                     spec.global_batch * spec.tokens_per_sample / job_step, now))
    for name, share in spec.shares.items():
        rows.append((step, -1, name, share * spec.step_s * noise, now))
    for r, t in enumerate(rank_step):
        rows += [(step, r, TIME_STEP, t, now), (step, r, STRAGGLER_SCORE, t / mid, now),
                 (step, r, MEM_RSS, 2.1e9 + 1e6 * progress * 50 + r * 3e7, now)]
        if spec.cuda_total_bytes:
            peak = spec.cuda_peak_share * spec.cuda_total_bytes * (0.97 + 0.03 * progress)
            rows += [(step, r, MEM_CUDA_PEAK, peak, now),
                     (step, r, MEM_CUDA_TOTAL, spec.cuda_total_bytes, now)]
    if spec.eval_every and step % spec.eval_every == 0:
        rows += [(step, -1, EVAL_LOSS, loss * 1.08 + 0.02, now),
                 (step, -1, "accuracy", 0.98 - 0.88 * math.exp(-4.0 * progress), now)]
    return rows


def synthetic_rows(spec: Synthetic, start: float | None = None) -> list[MetricRow]:
    """Metric rows (step, rank, name, value, time) of a whole synthetic run."""
    rng = random.Random(spec.seed)
    now = time.time() if start is None else start
    rows: list[MetricRow] = []
    for step in range(spec.log_every, spec.steps + 1, spec.log_every):
        now += spec.step_s * spec.log_every
        rows += _window(spec, rng, step, now)
    return rows


def write_synthetic(store: RunStore, run_id: str, name: str, spec: Synthetic,
                    config: Mapping[str, Any] | None = None) -> list[MetricRow]:
    """Record a whole synthetic run (start, metrics, events, finish) in `store`."""
    env = {"torch": "synthetic", "device": "cuda" if spec.cuda_total_bytes else "cpu",
           "world_size": spec.world_size, "host": "synthetic", "git_commit": None,
           "python": "3.11"}
    cfg = dict(config or {"train": {"steps": spec.steps, "global_batch": spec.global_batch},
                          "data": {"workers": 2, "prefetch": 2},
                          "plan": {"strategy": DDP.name, "bucket_mb": 25.0}})
    store.start_run(run_id, name, cfg, {"strategy": DDP.name, "world_size": spec.world_size}, env)
    rows = synthetic_rows(spec)
    store.log_metrics(run_id, rows)
    if spec.nan_at is not None:
        store.log_event(run_id, spec.nan_at, -1, "nan", "loss is NaN", value=math.nan)
    store.finish_run(run_id, RunStatus.FAILED if spec.nan_at is not None else RunStatus.COMPLETED,
                     {"steps": spec.steps, "final_loss": rows[-1][3] if rows else None})
    return rows
