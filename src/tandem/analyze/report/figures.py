"""Series and headline figures out of the store's metric rows (plain dicts)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tandem.analyze import stats
from tandem.monitor import catalogue as cat
from tandem.monitor.catalogue import (
    GRAD_NOISE_SCALE,
    LOSS,
    MEM_CUDA_PEAK,
    MEM_RSS,
    MFU,
    SAMPLES_PER_S,
    STRAGGLER_SCORE,
    TASK_LOSS,
    TASK_SHARE,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_H2D,
    TIME_OPTIM,
    TIME_STEP,
    TIME_SYNC_WAIT,
    TOKENS_PER_S,
    TRAINING_CURVES,
    split_task_metric,
    task_kind,
)

T = TypeVar("T")
Metric = Mapping[str, Any]  # {"step", "rank", "name", "value", "time"}

# The phases of a step, in the order they are stacked, with their labels.
PHASES: tuple[tuple[str, str], ...] = (
    (TIME_DATA, "data wait"),
    (TIME_H2D, "host-to-device"),
    (TIME_COMPUTE, "forward+backward"),
    (TIME_COMM_EXPOSED, "exposed comm (wire)"),
    (TIME_SYNC_WAIT, "waiting for peers"),
    (TIME_OPTIM, "optimizer"),
)
# Names the trainer writes that are not evaluation or user metrics.
TRAINING_NAMES = frozenset({
    TIME_STEP, *TRAINING_CURVES, GRAD_NOISE_SCALE, STRAGGLER_SCORE,
    *(name for name, _ in PHASES)})


def by_name(metrics: Iterable[Metric]) -> dict[str, list[Metric]]:
    """Rows grouped by metric name, each group in the order given."""
    out: dict[str, list[Metric]] = defaultdict(list)
    for m in metrics:
        out[m["name"]].append(m)
    return dict(out)


def in_window(metrics: Iterable[Metric], window: tuple[int, int] | None) -> list[Metric]:
    """Rows whose step lies in the inclusive window (all rows when window is None)."""
    if window is None:
        return list(metrics)
    lo, hi = window
    if lo > hi:
        raise ValueError(f"window must be (first_step, last_step) with first <= last; "
                         f"got {window}")
    return [m for m in metrics if lo <= m["step"] <= hi]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def series(rows: Sequence[Metric],
           reduce: Callable[[Sequence[float]], float] = _mean) -> tuple[list[int], list[float]]:
    """One value per step: the job-wide row (rank -1) if any, else `reduce` (the mean)
    over the ranks' rows of that step.

    NaN stays NaN (a NaN on any rank makes the mean NaN, which is what happened).
    """
    job = [r for r in rows if r["rank"] == -1]
    if job:
        pairs = sorted((int(r["step"]), float(r["value"])) for r in job)
        return [s for s, _ in pairs], [v for _, v in pairs]
    per_step: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        per_step[int(r["step"])].append(float(r["value"]))
    steps = sorted(per_step)
    return steps, [reduce(per_step[s]) for s in steps]


def series_of(groups: Mapping[str, Sequence[Metric]], name: str) -> tuple[list[int], list[float]]:
    """`series` of one name from `by_name` groups (empty lists when it is absent)."""
    return series(groups.get(name, ()))


def per_rank(rows: Sequence[Metric]) -> dict[int, dict[int, float]]:
    """rank -> step -> value, for ranks >= 0 (the last row wins on a repeat)."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["rank"] >= 0:
            out[int(r["rank"])][int(r["step"])] = float(r["value"])
    return dict(out)


def straggler_scores(groups: Mapping[str, Sequence[Metric]]) -> dict[int, dict[int, float]]:
    """rank -> step -> score: the recorded `straggler/score`, else computed from per-rank
    `time/step` as the rank's step time over the median across ranks in that window."""
    recorded = per_rank(groups.get(STRAGGLER_SCORE, ()))
    if recorded:
        return recorded
    times = per_rank(groups.get(TIME_STEP, ()))
    if len(times) < 2:
        return {}
    steps = sorted({s for by_step in times.values() for s in by_step})
    scores: dict[int, dict[int, float]] = {rank: {} for rank in times}
    for step in steps:
        here = {rank: t[step] for rank, t in times.items()
                if step in t and math.isfinite(t[step])}
        if len(here) < 2:
            continue
        mid = stats.median(list(here.values()))
        for rank, value in here.items():
            scores[rank][step] = value / mid if mid > 0 else math.nan
    return scores


def drop_warmup(items: Sequence[T]) -> list[T]:
    """Leave out the first logging window when there are at least 4: it holds warm-up
    (allocator growth, cuDNN autotuning, compilation) that later windows do not."""
    return list(items[1:]) if len(items) >= 4 else list(items)


def steady(steps: list[int], values: list[float]) -> tuple[list[int], list[float]]:
    """`drop_warmup` applied to a (steps, values) series."""
    return drop_warmup(steps), drop_warmup(values)


def steady_median(groups: Mapping[str, Sequence[Metric]], name: str) -> float | None:
    """Median of the finite steady-state values of a metric (None when it has none)."""
    _, values = steady(*series_of(groups, name))
    good = stats.finite(values)
    return stats.median(good) if good else None


def last_finite(values: Sequence[float]) -> float | None:
    """The last finite value, or None."""
    for v in reversed(values):
        if v is not None and math.isfinite(v):
            return float(v)
    return None


HEADLINE_KEYS = ("steps", "duration_s", "final_loss", "best_loss", "samples_per_s",
                 "tokens_per_s", "step_s", "mfu", "cuda_peak_bytes", "rss_peak_bytes",
                 "grad_noise_scale")


def headline(run: Mapping[str, Any], metrics: Sequence[Metric]) -> dict[str, Any]:
    """The key numbers of a run: HEADLINE_KEYS, then the last value of each evaluation
    metric under its own name."""
    groups = by_name(metrics)
    steps_all = [int(m["step"]) for m in metrics]
    loss_steps, loss = series_of(groups, LOSS)
    finished = run.get("finished")
    # The run's own wall time over its attempts (the summary's), not the calendar time
    # from its first start to its last end, which counts the gaps between attempts.
    wall = (run.get("summary") or {}).get("wall_time_s")
    out: dict[str, Any] = {
        "steps": max(steps_all) if steps_all else 0,
        "duration_s": wall if wall else ((finished - run["started"]) if finished else None),
        "final_loss": last_finite(loss),
        "best_loss": min(stats.finite(loss)) if stats.finite(loss) else None,
        "samples_per_s": steady_median(groups, SAMPLES_PER_S),
        "tokens_per_s": steady_median(groups, TOKENS_PER_S),
        "step_s": steady_median(groups, TIME_STEP),
        "mfu": steady_median(groups, MFU),
        # The diagnosis's own reading (find_scale), so that one figure is quoted everywhere.
        "grad_noise_scale": steady_median(groups, GRAD_NOISE_SCALE),
    }
    peaks = stats.finite(m["value"] for m in groups.get(MEM_CUDA_PEAK, ()))
    rss = stats.finite(m["value"] for m in groups.get(MEM_RSS, ()))
    out["cuda_peak_bytes"] = max(peaks) if peaks else None
    out["rss_peak_bytes"] = max(rss) if rss else None
    for name in eval_names(groups):
        out[name] = last_finite(series_of(groups, name)[1])
    training = {task_kind(TASK_LOSS), task_kind(TASK_SHARE)}
    for name, (_, what) in task_names(groups).items():
        if what not in training:  # each source's evaluation, after the task's own
            out[name] = last_finite(series_of(groups, name)[1])
    return out


def task_names(groups: Mapping[str, Sequence[Metric]]) -> dict[str, tuple[str, str]]:
    """A mixture's figures of each source (task/<source>/<what>), by name, sorted: each
    with its (source, what)."""
    split = {n: split_task_metric(n) for n in sorted(groups)}
    return {n: parts for n, parts in split.items() if parts is not None}


def eval_names(groups: Mapping[str, Sequence[Metric]]) -> list[str]:
    """Evaluation and user metrics: plain names that are not training figures.

    Measured figures are namespaced (time/, mem/, sys/, comm/, ...); metric names that
    a Task declares are not.
    """
    return sorted(n for n in groups if n not in TRAINING_NAMES and "/" not in n)


ASYNC_HEADER = ("worker", "local steps", "pushes", "pushed early", "staleness mean",
                "staleness max", "fresh pushes", "pull wait / step")


def async_workers(groups: Mapping[str, Sequence[Metric]]) -> list[list[str]]:
    """One row per worker of an asynchronous run (ASYNC_HEADER): its steps and pushes
    summed over the windows, the staleness of its pushes (the run's, as of its last
    window) and its mean wait to pull; none for other plans."""
    steps = per_rank(groups.get(cat.ASYNC_LOCAL_STEPS, ()))
    last = {name: per_rank(groups.get(name, ()))
            for name in (cat.ASYNC_STALENESS_MEAN, cat.ASYNC_STALENESS_MAX, cat.ASYNC_FRESH)}
    pushes, early = (per_rank(groups.get(n, ()))
                     for n in (cat.ASYNC_PUSHES, cat.ASYNC_EARLY_PUSHES))
    wait = per_rank(groups.get(cat.COMM_PULL_WAIT, ()))

    def final(name: str, rank: int, form: str) -> str:
        values = last[name].get(rank)
        return form.format(values[max(values)]) if values else "-"

    return [[str(r), f"{sum(steps[r].values()):.0f}", f"{sum(pushes[r].values()):.0f}",
             f"{sum(early.get(r, {}).values()):.0f}",
             final(cat.ASYNC_STALENESS_MEAN, r, "{:.2f}"),
             final(cat.ASYNC_STALENESS_MAX, r, "{:.0f}"),
             final(cat.ASYNC_FRESH, r, "{:.0%}"),
             f"{statistics.fmean(wait[r].values()) * 1e3:.2f} ms" if wait.get(r) else "-"]
            for r in sorted(steps)]
