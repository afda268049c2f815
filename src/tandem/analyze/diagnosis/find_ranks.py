"""Findings about ranks that differ: a straggler, uneven data, a device running out of memory."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import Context, Finding
from tandem.analyze.report.figures import Metric, per_rank, steady
from tandem.analyze.report.figures import straggler_scores as _scores
from tandem.monitor.catalogue import (
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    SYS_CPU,
    SYS_PROCESS_CPU,
    TIME_DATA,
    TIME_STEP,
)

MEMORY_BOUND_SHARE = 0.90
STRAGGLER_SCORE = 1.15
STRAGGLER_WINDOW_SHARE = 0.5
STRAGGLER_MIN_WINDOWS = 2
IMBALANCE_RATIO = 2.0
IMBALANCE_MIN_SHARE = 0.10
FOREIGN_CORES = 0.5  # cores of other jobs worth naming beside a straggler


def memory_bound(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
    # Device memory does not change during a run: each rank's largest recorded total
    # (else any rank's) pairs with every peak, however often the total was written.
    totals: dict[int, float] = {}
    for m in groups.get(MEM_CUDA_TOTAL, ()):
        if math.isfinite(m["value"]) and m["value"] > 0:
            totals[m["rank"]] = max(totals.get(m["rank"], 0.0), m["value"])
    fallback = max(totals.values(), default=0.0)
    worst: tuple[float, Metric, float] | None = None
    for m in groups.get(MEM_CUDA_PEAK, ()):
        total = totals.get(m["rank"], fallback)
        if total and math.isfinite(m["value"]) and (worst is None
                                                     or m["value"] / total > worst[0]):
            worst = (m["value"] / total, m, total)
    if worst is None or worst[0] <= MEMORY_BOUND_SHARE:
        return None
    share, row, total = worst
    gib = 2.0 ** 30
    evidence = {"share": share, "peak_bytes": row["value"], "total_bytes": total,
                "rank": row["rank"], "step": row["step"]}
    return Finding(
        "memory-bound", "high" if share >= 0.97 else "medium", evidence,
        f"CUDA peak memory is {share:.0%} of the device ({row['value'] / gib:.2f} GiB of "
        f"{total / gib:.2f} GiB on rank {row['rank']} at step {row['step']}) -> one larger "
        f"batch or sequence will not fit: checkpoint activations, shard the model, or "
        f"use smaller micro-batches",
        ["plan.strategy fsdp: shard parameters, gradients and optimizer state",
         "train.micro_batch smaller: accumulation keeps the global batch",
         "precision.mode bf16: halves activation memory"])



def foreign_cores(ctx: Context) -> float | None:
    """Cores the host spent beyond the run's own processes (other jobs), the median over
    windows; None where the run recorded no host and process CPU or no core count."""
    env = ctx.env or {}
    cores, world = env.get("cpu_count"), env.get("world_size")
    host = {m["step"]: m["value"] for m in ctx.groups.get(SYS_CPU, ())
            if m["rank"] == -1}
    proc = {m["step"]: m["value"] for m in ctx.groups.get(SYS_PROCESS_CPU, ())
            if m["rank"] == -1}
    if not isinstance(cores, int) or not isinstance(world, int):
        return None
    # On one host every rank's process is on it: beyond world x one rank's CPU is foreign.
    steps, _ = steady(sorted(set(host) & set(proc)), sorted(set(host) & set(proc)))
    values = stats.finite(max(0.0, (cores * host[s] - world * proc[s]) / 100.0) for s in steps)
    return stats.median(values) if values else None


def _straggler_advice(ctx: Context, rank: int) -> list[str]:
    """What to do about a slow rank: a node to exclude only where there are nodes."""
    advice = [f"check the host of rank {rank}: CPU contention, thermal throttling, a slower "
              "device or link",
              "data.workers: a rank short of loader processes waits on its batches"]
    nodes = ctx.nodes
    if nodes is not None and nodes > 1:
        advice.append("exclude or replace that node (torchrun restarts the group at the new "
                      "size)")
    elif nodes == 1:
        foreign = foreign_cores(ctx)
        other = (f" (other jobs used ~{foreign:.1f} cores beside the run)"
                 if foreign is not None and foreign >= FOREIGN_CORES else "")
        advice.append(f"every rank is on this one host{other}: the slow rank is the one other "
                      "work takes cores from; run on a quieter host or fewer processes")
    return advice


def straggler(ctx: Context) -> Finding | None:
    groups = ctx.groups
    slow: dict[int, dict[str, float]] = {}
    for rank, by_step in sorted(_scores(groups).items()):
        steps = sorted(by_step)
        _, values = steady(steps, [by_step[s] for s in steps])
        values = stats.finite(values)
        if len(values) < STRAGGLER_MIN_WINDOWS:
            continue
        over = sum(v > STRAGGLER_SCORE for v in values)
        if over > STRAGGLER_WINDOW_SHARE * len(values):
            slow[rank] = {"median_score": stats.median(values), "windows_over": over,
                          "windows": len(values)}
    if not slow:
        return None
    worst = max(slow, key=lambda r: slow[r]["median_score"])
    w = slow[worst]
    if len(slow) == 1:
        who = f"rank {worst} is a straggler: its"
    else:
        who = (f"ranks {', '.join(map(str, slow))} are stragglers: the slowest, rank {worst}, "
               "has a")
    evidence = {"rank": worst, "ranks": list(slow), "per_rank": slow}
    figures = (f"{who} step time {w['median_score']:.2f}x the median over ranks (over "
               f"{STRAGGLER_SCORE:g}x in {w['windows_over']:.0f} of {w['windows']:.0f} windows)")
    if ctx.cfg("plan.strategy") == "async":  # nobody waits: it pushes less often
        return Finding(
            "straggler", "info", evidence,
            f"{figures} -> under plan.strategy async nobody waits for it: it pushes less "
            "often (async/pushes per worker) and the others take its shares",
            _straggler_advice(ctx, worst))
    return Finding(
        "straggler", "high" if w["median_score"] >= 1.5 else "medium", evidence,
        f"workers wait for a straggler: {figures} -> every rank waits for it at each "
        "meeting of the replicas (the gradient all-reduce, or the outer step)",
        [*_straggler_advice(ctx, worst),
         "plan.strategy async (plan.staleness 2): a slow worker pushes less often instead of "
         "holding the others; validate by time to target (benchmarks/straggler.py)"])



def data_imbalance(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
    data, step = per_rank(groups.get(TIME_DATA, ())), per_rank(groups.get(TIME_STEP, ()))
    if len(data) < 2:
        return None
    windows = sorted({s for by_step in data.values() for s in by_step})
    windows, _ = steady(windows, windows)
    over: dict[int, list[float]] = {}
    counted = 0
    for w in windows:
        here = {r: d[w] for r, d in data.items() if w in d and math.isfinite(d[w])}
        if len(here) < 2:
            continue
        counted += 1
        median = stats.median(list(here.values()))
        for rank, value in here.items():
            own_step = step.get(rank, {}).get(w, math.nan)
            if (value > IMBALANCE_RATIO * max(median, 1e-12)
                    and value > IMBALANCE_MIN_SHARE * own_step):
                over.setdefault(rank, []).append(value / max(median, 1e-12))
    slow = {r: v for r, v in over.items()
            if counted >= STRAGGLER_MIN_WINDOWS and len(v) > counted / 2}
    if not slow:
        return None
    worst = max(slow, key=lambda r: stats.median(slow[r]))
    ratio = stats.median(slow[worst])
    return Finding(
        "data-imbalance", "high" if ratio >= 2 * IMBALANCE_RATIO else "medium",
        {"rank": worst, "ranks": sorted(slow), "ratio": ratio, "windows_over": len(slow[worst]),
         "windows": counted},
        f"rank {worst} waits {ratio:.1f}x the median rank's time for its batches (in "
        f"{len(slow[worst])} of {counted} windows) -> its share of the data costs more to "
        "load, and the others wait for it at each all-reduce",
        ["data.workers: more loader processes hide uneven per-sample cost",
         f"check what rank {worst} reads: slower storage, larger or compressed samples",
         "shuffle so that costly samples spread over the ranks"])
