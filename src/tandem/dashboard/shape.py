"""Turn store rows into what a page draws: series, heatmaps, segments, JSON-safe values."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.dashboard.downsample import DEFAULT_COLUMNS, DEFAULT_POINTS, column_max, take
from tandem.dashboard.downsample import minmax_indices as _indices

JOB = -1  # the rank of job-wide rows
# Names with only per-rank rows are drawn one line per rank, up to this many ranks.
MAX_RANK_LINES = 16
# Events that start a new segment of a run (a resumed or restarted process group).
SEGMENT_KINDS = frozenset({"resume", "restart"})


def jsonable(value: Any) -> Any:
    """`value` with non-finite floats as the strings "NaN", "Infinity", "-Infinity" (JSON
    has no NaN, and a NaN loss must reach the page as NaN), dataclasses as dicts, tuples
    and sets as lists, and anything else unknown as its text."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return [jsonable(v) for v in sorted(value, key=str)]
    return str(value)


def _text(x: float) -> float | str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def numbers(values: Sequence[float]) -> list[float | str]:
    """`jsonable` for a list of floats, fast."""
    isfinite = math.isfinite
    return [v if isfinite(v) else _text(v) for v in values]


def metric_rows(rows: Sequence[tuple]) -> list[list[Any]]:
    """Store rows (rowid, step, rank, name, value, time) as the page's [step, rank, name,
    value, time], JSON-safe: `jsonable` for this one shape without walking each value (a
    live run's stream is mostly these rows)."""
    isfinite = math.isfinite
    return [[r[1], r[2], r[3], r[4] if isfinite(r[4]) else _text(r[4]), r[5]] for r in rows]


def _dedupe(points: list[tuple]) -> list[tuple]:
    """One point per step, the last one written (a rolled-back run writes steps again).

    Points come sorted by step, repeats in the order written."""
    if len({p[0] for p in points}) == len(points):
        return points
    by_step: dict[int, tuple] = {}
    for p in points:
        by_step[p[0]] = p
    return [by_step[s] for s in sorted(by_step)]


def series_payload(points: list[tuple], limit: int = DEFAULT_POINTS,
                   times: bool = True) -> dict[str, Any]:
    """{"step", "value", "time", "n"} of one line of (step, value[, time]) points,
    downsampled to `limit` points; without `times`, only the last point's time."""
    points = _dedupe(points)
    values = [p[1] for p in points]
    keep = _indices(values, limit)
    out: dict[str, Any] = {"step": [points[i][0] for i in keep],
                           "value": numbers(take(values, keep)), "n": len(points)}
    if times:
        out["time"] = [points[i][2] for i in keep]
    elif points and len(points[-1]) > 2:
        out["last_time"] = points[-1][2]
    return out


def heatmap(by_rank: Mapping[int, Sequence[tuple]],
            columns: int = DEFAULT_COLUMNS) -> dict[str, Any] | None:
    """{"step", "ranks", "values"} of a rank x window matrix (ranks >= 0), at most
    `columns` columns, each bucket holding its largest value."""
    ranks = sorted(r for r in by_rank if r >= 0)
    if not ranks:
        return None
    cells = {r: {p[0]: p[1] for p in by_rank[r]} for r in ranks}
    steps = sorted({s for r in ranks for s in cells[r]})
    matrix = [[cells[r].get(s, math.nan) for s in steps] for r in ranks]
    steps, matrix = column_max(steps, matrix, columns)
    return {"step": steps, "ranks": ranks, "values": [numbers(r) for r in matrix]}


def segments(events: Sequence[Mapping[str, Any]], started: float,
             last_step: int) -> list[dict[str, Any]]:
    """The stretches of a run between resumes and restarts, from its events.

    A restart and the resume it leads to (same step) are one boundary.
    """
    out = [{"index": 0, "start_step": 0, "started": started, "cause": "start"}]
    for e in sorted(events, key=lambda e: (e["time"], e["step"])):
        if str(e["kind"]).lower() not in SEGMENT_KINDS:
            continue
        prev = out[-1]
        if prev["index"] > 0 and prev["start_step"] == e["step"]:
            prev["cause"] += f"; {e['message']}"
            continue
        out.append({"index": len(out), "start_step": int(e["step"]), "started": e["time"],
                    "cause": f"{e['kind']}: {e['message']}"})
    for seg, nxt in zip(out, [*out[1:], None], strict=True):
        seg["end_step"] = last_step if nxt is None else max(seg["start_step"],
                                                             nxt["start_step"])
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {"a.b.c": leaf}; lists and scalars are leaves."""
    if not isinstance(tree, Mapping):
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out
