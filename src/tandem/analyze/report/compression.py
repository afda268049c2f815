"""A compression experiment's trade-off, as `tandem compress` records it on the run it
compressed: each model's metric against its latency and against its size, the original
(the control) and the adopted one marked, the budget's bound drawn.

`tandem compress` writes one trial per model into the run's trials (`record`), all of one
experiment under one `COMPRESS_PREFIX` stamp; the run's report and the dashboard's run
page draw the newest experiment (`tradeoff_html`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.analyze.report import html, svg

COMPRESS_PREFIX = "compress-"
ORIGINAL = "original"
COLORS = {"adopted": "#3ca951", "control": "#4269d0", "rejected": "#9498a0"}


def record(store: Any, run_id: str, result: Mapping[str, Any]) -> None:
    """Write a `tandem compress` result (compress.json's content) as the run's trials:
    the original, then every candidate, each with its status and why."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    chosen = result["chosen"]["technique"]
    why = {r["technique"]: r["why"] for r in result["rejected"]}
    shared = {k: result[k] for k in ("metric", "higher_is_better", "budget", "budget_unit",
                                      "prefer", "verdict")}
    for i, figures in enumerate([result["original"], *result["candidates"]]):
        name = figures["technique"]
        status = ("adopted" if name == chosen else "control" if name == ORIGINAL
                  else "rejected")
        store.log_trial(run_id, f"{COMPRESS_PREFIX}{stamp}-{i:02d}", {"technique": name},
                        status, {**figures, **shared, "experiment": stamp},
                        why.get(name, result["verdict"] if name == chosen else ""))


def newest(trials: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The trials of the run's newest compression experiment (none: [])."""
    mine = [t for t in trials if str(t["trial_id"]).startswith(COMPRESS_PREFIX)]
    if not mine:
        return []
    last = max(str((t.get("figures") or {}).get("experiment", "")) for t in mine)
    return [t for t in mine if str((t.get("figures") or {}).get("experiment", "")) == last]


def bound(figures: Mapping[str, Any], original: float) -> float:
    """The worst metric the budget allows (points of a fraction, or the metric's units)."""
    budget = float(figures["budget"])
    return original - budget / 100 if figures["higher_is_better"] else original + budget


def tradeoff_html(trials: Sequence[Mapping[str, Any]]) -> str:
    """The newest experiment's trade-off charts and table ('' when the run has none)."""
    rows = newest(trials)
    if not rows:
        return ""
    first = rows[0]["figures"]
    metric = first["metric"]
    base = next((t["figures"][metric] for t in rows if t["plan"]["technique"] == ORIGINAL),
                None)
    level = bound(first, base) if base is not None else None
    level_label = f"the budget: {first['budget']:g} {first['budget_unit']} from the original"

    def dots(x_of: Any) -> list[svg.Dot]:
        return [svg.Dot(float(x_of(t["figures"])), float(t["figures"][metric]),
                        t["plan"]["technique"], COLORS.get(t["status"], COLORS["rejected"]),
                        ring=t["status"] == "adopted") for t in rows]

    latency = svg.scatter(dots(lambda f: f["latency_ms"]["batch_64"]), "compress-latency",
                          x_label="CPU latency at batch 64, ms", y_label=metric,
                          log_x=True, level=level, level_label=level_label)
    size = svg.scatter(dots(lambda f: f["bytes"]), "compress-size",
                       x_label="serialised bytes", y_label=metric, log_x=True, level=level,
                       level_label=level_label)
    table = html.list_table(
        ["model", metric, "parameters", "bytes", "ms @1", "ms @64", "status", "why"],
        [[t["plan"]["technique"], _metric_text(t["figures"], metric),
          f"{t['figures']['params']:,}", f"{t['figures']['bytes']:,}",
          f"{t['figures']['latency_ms']['batch_1']:.3f}",
          f"{t['figures']['latency_ms']['batch_64']:.3f}", str(t["status"]),
          str(t.get("decision") or "")] for t in rows],
        numeric=[False, True, True, True, True, True, False, False])
    note = (f"{first['verdict']}. Green ring: adopted; blue: the original (control); "
            "grey: rejected; dashed: the budget's bound.")
    return ("<h2>Compression</h2><div class=\"grid\">"
            + html.card(f"{metric} against latency", latency, note)
            + html.card(f"{metric} against size", size)
            + "</div>" + html.card("Candidates", table))


def _metric_text(figures: Mapping[str, Any], metric: str) -> str:
    value = f"{figures[metric]:.4g}"
    if "interval" in figures:
        low, high = figures["interval"]
        value += f" [{low:.4g}, {high:.4g}]"
    return value
