"""Turn a run's figures into a verdict: named bottlenecks with evidence and plan changes.

Shares are medians over the steady logging windows (the first window is left out when
there are at least 4: it holds warm-up), phase time over step time, both job-wide
(rank -1) or averaged over ranks when only per-rank rows exist.

=====================  ==========================================================
finding                fires when
=====================  ==========================================================
input-bound            ``time/data`` > INPUT_BOUND_SHARE (20%) of ``time/step``
communication-bound    ``time/comm_exposed`` > COMM_BOUND_SHARE (25%) of ``time/step``
memory-bound           ``mem/cuda_peak_bytes`` > MEMORY_BOUND_SHARE (90%) of
                       ``mem/cuda_total_bytes`` on any rank in any window
straggler              a rank's ``straggler/score`` (its step time / the median over
                       ranks) > STRAGGLER_SCORE (1.15) in more than
                       STRAGGLER_WINDOW_SHARE (50%) of at least
                       STRAGGLER_MIN_WINDOWS (2) windows
data-imbalance         a rank's ``time/data`` > IMBALANCE_RATIO (2x) the median over
                       ranks and > IMBALANCE_MIN_SHARE (10%) of its ``time/step``, in
                       more than half of at least STRAGGLER_MIN_WINDOWS windows (some
                       ranks' batches cost more to load: uneven samples or storage)
unstable               any non-finite loss or grad norm, any event whose kind is in
                       UNSTABLE_EVENT_KINDS (e.g. nonfinite, loss_spike), a loss rise
                       with robust z > LOSS_SPIKE_Z (6) and > LOSS_SPIKE_MIN_RISE (5%)
                       of the loss, or
                       ``loss_scale`` falling in >= LOSS_SCALE_DROPS (3) windows
compute-bound          ``time/compute`` > COMPUTE_BOUND_SHARE (70%) of ``time/step``
                       and no input, communication, memory or straggler finding
balanced               ``time/step`` exists and no input, communication, memory,
                       straggler or compute finding fired
=====================  ==========================================================

Severity is "high" when a share is at least twice its threshold (or on any non-finite
value), "medium" past the threshold, "low" for compute-bound (where a run should be)
and "info" for balanced. Findings come sorted by severity, then by size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.analyze import stats
from tandem.analyze.figures import (
    PHASES,
    Metric,
    by_name,
    drop_warmup,
    in_window,
    per_rank,
    series_of,
    steady,
)
from tandem.analyze.figures import straggler_scores as _scores

INPUT_BOUND_SHARE = 0.20
H2D_SHARE = 0.10  # host-to-device copies this large suggest pinned memory
COMM_BOUND_SHARE = 0.25
MEMORY_BOUND_SHARE = 0.90
STRAGGLER_SCORE = 1.15
STRAGGLER_WINDOW_SHARE = 0.5
STRAGGLER_MIN_WINDOWS = 2
COMPUTE_BOUND_SHARE = 0.70
IMBALANCE_RATIO = 2.0
IMBALANCE_MIN_SHARE = 0.10
LOSS_SPIKE_Z = 6.0
LOSS_SPIKE_MIN_RISE = 0.05
LOSS_SPIKE_MIN_WINDOWS = 8
LOSS_SCALE_DROPS = 3
# Event kinds (compared lower-case, "_" read as "-") that mean the math went wrong;
# monitor.detect writes nonfinite, loss_spike and grad_explosion.
UNSTABLE_EVENT_KINDS = frozenset({
    "nan", "non-finite", "nonfinite", "loss-spike", "grad-spike", "grad-explosion",
    "divergence", "overflow", "skipped-step"})
SEVERE_EVENT_KINDS = frozenset({"nan", "non-finite", "nonfinite", "divergence"})

SEVERITIES = ("high", "medium", "low", "info")
PERFORMANCE_KINDS = frozenset({
    "input-bound", "communication-bound", "memory-bound", "straggler", "data-imbalance",
    "compute-bound"})


# Control experiments: how a finding's claim is checked (analyze/validate.py runs them).
NO_COMM = "no_comm"  # the same job with no gradient communication (replicas never meet)
IN_MEMORY_DATA = "in_memory_data"  # the same job on batches already in memory


@dataclass(frozen=True)
class Finding:
    """One named observation about a run, with the numbers behind it and what to try.

    A performance finding names a cause and so predicts what removing it would gain
    (`predicted_speedup`: step time over step time without it); `control` names the
    experiment that removes it, and `validation` holds that experiment's outcome when it
    was run: {"state": "confirmed" | "refuted" | "inconclusive", "predicted": x,
    "measured": y, "interval": [lo, hi], "runs": n, ...}. A refuted finding is reported
    as refuted, never as a bottleneck.
    """

    kind: str
    severity: str
    evidence: dict[str, Any]
    message: str
    suggestions: list[str] = field(default_factory=list)
    predicted_speedup: float | None = None
    control: str | None = None
    validation: dict[str, Any] | None = None


@dataclass(frozen=True)
class _Share:
    phase_s: float
    step_s: float
    windows: int

    @property
    def share(self) -> float:
        return self.phase_s / self.step_s if self.step_s > 0 else 0.0

    def quote(self) -> str:
        return f"{self.share:.0%} of step time ({self.phase_s:.3g} s of {self.step_s:.3g} s)"

    def evidence(self) -> dict[str, Any]:
        return {"share": self.share, "phase_s": self.phase_s, "step_s": self.step_s,
                "windows": self.windows}


def _share(groups: Mapping[str, Sequence[Metric]], name: str) -> _Share | None:
    """Median phase time and median step time over the windows that have both."""
    p_steps, p_vals = series_of(groups, name)
    s_steps, s_vals = series_of(groups, "time/step")
    step_at = dict(zip(s_steps, s_vals, strict=True))
    pairs = [(s, p, step_at[s]) for s, p in zip(p_steps, p_vals, strict=True)
             if s in step_at and math.isfinite(p) and math.isfinite(step_at[s])]
    if not pairs:
        return None
    kept = drop_warmup(pairs)
    return _Share(stats.median([p for _, p, _ in kept]), stats.median([t for _, _, t in kept]),
                  len(kept))


def _severity(share: float, threshold: float) -> str:
    return "high" if share >= 2 * threshold else "medium"


def _cfg(config: Mapping[str, Any] | None, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _input_bound(groups: Mapping[str, Sequence[Metric]],
                 config: Mapping[str, Any] | None) -> Finding | None:
    data = _share(groups, "time/data")
    if data is None or data.share <= INPUT_BOUND_SHARE:
        return None
    workers, prefetch = _cfg(config, "data.workers"), _cfg(config, "data.prefetch")
    more_workers = f"{workers} -> {max(2, 2 * workers)}" if isinstance(workers, int) else "more"
    deeper = f"{prefetch} -> {2 * prefetch}" if isinstance(prefetch, int) else "deeper"
    suggestions = [
        f"data.workers {more_workers}: more loader processes per rank",
        f"data.prefetch {deeper}: more batches loaded ahead of the step",
    ]
    evidence = data.evidence()
    h2d = _share(groups, "time/h2d")
    if h2d is not None:
        evidence["h2d_share"] = h2d.share
        if h2d.share > H2D_SHARE:
            suggestions.append(f"data.pin_memory true: host-to-device copies take "
                               f"{h2d.quote()}")
    suggestions.append("move decoding/augmentation off the step (cache decoded samples)")
    return Finding(
        "input-bound", _severity(data.share, INPUT_BOUND_SHARE), evidence,
        f"data wait is {data.quote()} -> the loader does not keep up: try more workers "
        f"(data.workers), deeper prefetch (data.prefetch) or cheaper preprocessing",
        suggestions)


def _communication_bound(groups: Mapping[str, Sequence[Metric]],
                         config: Mapping[str, Any] | None) -> Finding | None:
    comm = _share(groups, "time/comm_exposed")
    if comm is None or comm.share <= COMM_BOUND_SHARE:
        return None
    bucket = _cfg(config, "plan.bucket_mb")
    bigger = (f"{bucket:g} -> {4 * bucket:g}" if isinstance(bucket, int | float)
              else "larger")
    return Finding(
        "communication-bound", _severity(comm.share, COMM_BOUND_SHARE), comm.evidence(),
        f"exposed communication is {comm.quote()} -> try gradient compression "
        f"(plan.comm_hook fp16/powersgd), larger buckets (plan.bucket_mb), or local SGD",
        ["plan.comm_hook fp16 or powersgd: fewer bytes per all-reduce",
         f"plan.bucket_mb {bigger}: fewer, larger all-reduces that overlap better",
         "plan.static_graph true: lets DDP schedule buckets ahead when the graph is fixed",
         "plan.strategy localsgd or diloco: meet every plan.sync_every steps instead of "
         "every step (check convergence)"])


def _memory_bound(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
    # Device memory does not change during a run: each rank's largest recorded total
    # (else any rank's) pairs with every peak, however often the total was written.
    totals: dict[int, float] = {}
    for m in groups.get("mem/cuda_total_bytes", ()):
        if math.isfinite(m["value"]) and m["value"] > 0:
            totals[m["rank"]] = max(totals.get(m["rank"], 0.0), m["value"])
    fallback = max(totals.values(), default=0.0)
    worst: tuple[float, Metric, float] | None = None
    for m in groups.get("mem/cuda_peak_bytes", ()):
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


def _straggler(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
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
    return Finding(
        "straggler", "high" if w["median_score"] >= 1.5 else "medium", evidence,
        f"{who} step time {w['median_score']:.2f}x the median over ranks "
        f"(over {STRAGGLER_SCORE:g}x in {w['windows_over']:.0f} of {w['windows']:.0f} "
        f"windows) -> every rank waits for it at each all-reduce",
        [f"check the host of rank {worst}: CPU contention, thermal throttling, a slower "
         "device or link",
         "data.workers: a rank short of loader processes waits on its batches",
         "exclude or replace that node (torchrun restarts the group at the new size)"])


def event_kind(kind: object) -> str:
    """An event kind in the form UNSTABLE_EVENT_KINDS uses (lower case, "-" for "_")."""
    return str(kind).lower().replace("_", "-")


def _loss_spikes(groups: Mapping[str, Sequence[Metric]]) -> list[int]:
    steps, loss = series_of(groups, "loss")
    good = [(s, v) for s, v in zip(steps, loss, strict=True) if math.isfinite(v)]
    if len(good) < LOSS_SPIKE_MIN_WINDOWS:
        return []
    rises = [b[1] - a[1] for a, b in zip(good, good[1:], strict=False)]
    z = stats.robust_z(rises)
    return [good[i + 1][0] for i, (rise, score) in enumerate(zip(rises, z, strict=True))
            if score > LOSS_SPIKE_Z and rise > LOSS_SPIKE_MIN_RISE * abs(good[i][1])]


def _unstable(groups: Mapping[str, Sequence[Metric]], events: Iterable[Mapping[str, Any]],
              config: Mapping[str, Any] | None) -> Finding | None:
    nonfinite = sorted({int(m["step"]) for name in ("loss", "grad_norm")
                        for m in groups.get(name, ()) if not math.isfinite(m["value"])})
    flagged = [e for e in events if event_kind(e.get("kind", "")) in UNSTABLE_EVENT_KINDS]
    spikes = _loss_spikes(groups)
    _, scale = series_of(groups, "loss_scale")
    drops = sum(b < a for a, b in zip(scale, scale[1:], strict=False))
    if not (nonfinite or flagged or spikes or drops >= LOSS_SCALE_DROPS):
        return None
    parts = []
    if nonfinite:
        parts.append(f"non-finite loss/grad norm at {len(nonfinite)} logged step(s) "
                     f"(first at step {nonfinite[0]})")
    if flagged:
        kinds = sorted({str(e["kind"]) for e in flagged})
        parts.append(f"{len(flagged)} instability event(s) ({', '.join(kinds)}; first at "
                     f"step {min(int(e['step']) for e in flagged)})")
    if spikes:
        parts.append(f"{len(spikes)} loss spike(s) over {LOSS_SPIKE_Z:g} robust z "
                     f"(at step {', '.join(map(str, spikes[:5]))})")
    if drops >= LOSS_SCALE_DROPS:
        parts.append(f"the fp16 loss scale fell in {drops} windows")
    severe = bool(nonfinite) or any(event_kind(e["kind"]) in SEVERE_EVENT_KINDS
                                    for e in flagged)
    suggestions = ["train.grad_clip 1.0: bound the update when a batch is unusual",
                   "optim.warmup_steps: a longer warm-up, or a lower learning rate"]
    if _cfg(config, "precision.mode") == "fp16" or drops >= LOSS_SCALE_DROPS:
        suggestions.insert(0, "precision.mode bf16: fp16's range overflows; bf16 needs no "
                              "loss scaling")
    return Finding(
        "unstable", "high" if severe else "medium",
        {"nonfinite_steps": nonfinite, "events": len(flagged), "spike_steps": spikes,
         "loss_scale_drops": drops},
        "training is unstable: " + "; ".join(parts) + " -> clip gradients, warm up longer "
        "or lower the learning rate" + (", or switch fp16 to bf16" if drops else ""),
        suggestions)


def _compute_bound(groups: Mapping[str, Sequence[Metric]],
                   config: Mapping[str, Any] | None) -> Finding | None:
    compute = _share(groups, "time/compute")
    if compute is None or compute.share <= COMPUTE_BOUND_SHARE:
        return None
    _, mfu_values = steady(*series_of(groups, "mfu"))
    mfu = stats.finite(mfu_values)
    evidence = compute.evidence()
    mfu_text = ""
    if mfu:
        evidence["mfu"] = stats.median(mfu)
        mfu_text = f", MFU {evidence['mfu']:.0%}"
    suggestions = ["train.micro_batch larger (fewer accumulation steps) if memory allows: "
                   "bigger kernels run closer to peak"]
    if _cfg(config, "precision.mode") in (None, "fp32"):
        suggestions.insert(0, "precision.mode bf16: tensor cores and half the bytes")
    return Finding(
        "compute-bound", "low", evidence,
        f"compute is {compute.quote()}{mfu_text} -> the device is the limit, as it should "
        f"be; faster only with less work per sample or faster kernels",
        suggestions)


def _balanced(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
    _, step_values = steady(*series_of(groups, "time/step"))
    step_values = stats.finite(step_values)
    if not step_values:
        return None
    step_s = stats.median(step_values)
    shares = {label: s.share for name, label in PHASES
              if (s := _share(groups, name)) is not None}
    other = 1.0 - sum(shares.values())
    if shares:
        shares["other"] = max(0.0, other)
    parts = ", ".join(f"{label} {share:.0%}" for label, share in shares.items())
    return Finding(
        "balanced", "info", {"step_s": step_s, "shares": shares},
        f"no phase stands out ({parts or 'no phase timings'} of {step_s:.3g} s per step)",
        [])


def _data_imbalance(groups: Mapping[str, Sequence[Metric]]) -> Finding | None:
    data, step = per_rank(groups.get("time/data", ())), per_rank(groups.get("time/step", ()))
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


def diagnose(metrics: Iterable[Metric], events: Iterable[Mapping[str, Any]] = (),
             window: tuple[int, int] | None = None,
             config: Mapping[str, Any] | None = None) -> list[Finding]:
    """Findings for one run's metric rows (and events), most severe first.

    `window` keeps only steps in (first, last), inclusive. `config` (the run's resolved
    config tree, as stored) lets suggestions quote current values. Returns an empty list
    when the rows hold nothing to judge.
    """
    rows = in_window(metrics, window)
    chosen = [e for e in events if window is None or window[0] <= e["step"] <= window[1]
              or e["step"] < 0]
    groups = by_name(rows)
    found = [f for f in (_input_bound(groups, config), _communication_bound(groups, config),
                         _memory_bound(groups), _straggler(groups), _data_imbalance(groups))
             if f is not None]
    if not found and (compute := _compute_bound(groups, config)) is not None:
        found.append(compute)
    if not found and (balanced := _balanced(groups)) is not None:
        found.append(balanced)
    if (unstable := _unstable(groups, chosen, config)) is not None:
        found.append(unstable)
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity),
                                        -float(f.evidence.get("share", 0.0))))


def verdict(findings: Sequence[Finding]) -> Finding | None:
    """The finding to lead with: the most severe one (findings come sorted)."""
    return findings[0] if findings else None
