"""The peer comparison's figures, from the per-rank result files of each contender run.

Everything here is the same arithmetic for every contender: the clock in the result files
is the shared ``recipe.FetchLog`` (start of training at the first training sample, each
evaluation's start at its first evaluation sample, training again at the next training
sample).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from recipe import Recipe, Target


def ranks_ok(ranks: Sequence[dict[str, Any]]) -> bool:
    """Whether a run left a usable result (rank 0's file with its clock and evaluations)."""
    return bool(ranks) and ranks[0].get("rank") == 0 and ranks[0].get("t0_epoch") is not None \
        and bool(ranks[0].get("evals"))


def time_to(target: Target, evals: Sequence[dict[str, float]], starts: Sequence[float],
            pauses: Sequence[float]) -> dict[str, float] | None:
    """When `target` was first met: wall time (earlier evaluations included), the same with
    the evaluation pauses left out, and the step; None when never met."""
    for k, (values, start) in enumerate(zip(evals, starts, strict=False)):
        if target.met(values):
            return {"s": start, "train_only_s": start - sum(pauses[:k]),
                    "step": values["step"]}
    return None


def run_figures(r: Recipe, ranks: Sequence[dict[str, Any]], launch_epoch: float,
                exit_epoch: float) -> dict[str, Any]:
    """Time-to-target per target, training throughput, start-up, memory and the curve."""
    zero = ranks[0]
    evals, starts = zero["evals"], zero["eval_starts_s"]
    if len(evals) != len(starts):
        raise ValueError(f"{len(evals)} evaluations recorded but {len(starts)} seen starting")
    if evals[-1]["step"] != r.steps:
        raise ValueError(f"the last evaluation is at step {evals[-1]['step']}, not {r.steps}")
    pauses = [resume - start for start, resume in zip(starts, zero["resumes_s"], strict=False)]
    last = len(evals) - 1
    train_s = starts[last] - sum(pauses[:last])
    samples_per_s = r.steps * r.global_batch / train_s
    out: dict[str, Any] = {
        "targets": {t.label(): time_to(t, evals, starts, pauses) for t in r.targets},
        "train_s": train_s,
        "eval_pause_s": sum(pauses[:last]),
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * r.tokens_per_sample if r.tokens_per_sample else None,
        "ms_per_step": 1000 * train_s / r.steps,
        "startup_s": zero["t0_epoch"] - launch_epoch,
        "launcher_s": zero["process_start_epoch"] - launch_epoch,
        "teardown_s": exit_epoch - max(rank["end_epoch"] for rank in ranks),
        "total_s": exit_epoch - launch_epoch,
        "peak_rss_mib": max(rank["max_rss_mib"] for rank in ranks),
        "final": {k: v for k, v in evals[-1].items() if k != "step"},
        "best_accuracy": max((e["accuracy"] for e in evals if "accuracy" in e), default=None),
        "curve": {"s": list(starts), **{k: [e[k] for e in evals] for k in evals[0]}},
    }
    if "tandem_summary" in zero:
        out["tandem_summary"] = zero["tandem_summary"]
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Median, min and max of the values that exist, and how many were missing."""
    have = [v for v in values if v is not None and math.isfinite(v)]
    if not have:
        return None
    return {"median": statistics.median(have), "min": min(have), "max": max(have),
            "n": len(have), "missing": len(values) - len(have)}


def summarize(r: Recipe, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One contender's figures over its repeats (runs whose figures could be computed)."""
    done = [run["figures"] for run in runs if run.get("figures")]
    out: dict[str, Any] = {"runs": len(runs), "ok": len(done)}
    for t in r.targets:
        hits = [f["targets"][t.label()] for f in done]
        out[f"ttt {t.label()}"] = spread([h["s"] if h else None for h in hits])
        out[f"ttt {t.label()} train-only"] = spread([h["train_only_s"] if h else None
                                                     for h in hits])
        out[f"steps {t.label()}"] = spread([h["step"] if h else None for h in hits])
    for key in ("samples_per_s", "tokens_per_s", "ms_per_step", "startup_s", "launcher_s",
                "teardown_s", "total_s", "peak_rss_mib", "eval_pause_s", "best_accuracy"):
        out[key] = spread([f[key] for f in done])
    for name in ("accuracy", "loss"):
        out[f"final {name}"] = spread([f["final"].get(name) for f in done])
    return out


def fmt_spread(s: dict[str, Any] | None, digits: int = 1, scale: float = 1.0,
               suffix: str = "") -> str:
    """'median [min-max]' (with 'k/n' when some repeats are missing), or 'not reached'."""
    if s is None:
        return "not reached"
    med, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    text = f"{med:,.{digits}f}{suffix}"
    if s["n"] > 1:
        text += f" [{lo:,.{digits}f}-{hi:,.{digits}f}]"
    if s["missing"]:
        text += f" ({s['n']}/{s['n'] + s['missing']})"
    return text


def ratio(peer: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    """peer median / tandem median, or '-'."""
    if peer is None or base is None or not base["median"]:
        return "-"
    return f"{peer['median'] / base['median']:.2f}"
