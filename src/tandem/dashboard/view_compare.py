"""The Compare page: several runs' curves overlaid, and their figures side by side."""

from __future__ import annotations

import math
import sqlite3
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.dashboard import queries, series, shape
from tandem.dashboard.downsample import DEFAULT_POINTS
from tandem.dashboard.labels import label
from tandem.dashboard.view_run import UPDATE_LIMIT, NotFound
from tandem.monitor.catalogue import LOSS, SAMPLES_PER_S, TIME_STEP, TOKENS_PER_S, TRAINING_CURVES

Cursor = dict[str, int]
MAX_RUNS = 12
# Names overlaid besides the evaluation metrics (plain names a Task declares).
CURVES = (LOSS, SAMPLES_PER_S, TOKENS_PER_S, TIME_STEP)
TRAINING = frozenset(TRAINING_CURVES)


def _ids(args: Mapping[str, str]) -> list[str]:
    ids = [i for i in (args.get("runs") or "").split(",") if i]
    if len(ids) > MAX_RUNS:
        raise ValueError(f"runs: {len(ids)} runs given; at most {MAX_RUNS} can be compared")
    return list(dict.fromkeys(ids))


def curve_names(names: Sequence[str]) -> list[str]:
    """The names worth overlaying: training curves, then evaluation metrics."""
    evals = [n for n in names if "/" not in n and n not in TRAINING]
    return [n for n in CURVES if n in names] + sorted(evals)


def _steady_median(points: list[tuple]) -> float | None:
    # The first window holds warm-up (allocator, compilation): left out from 4 on.
    values = [p[1] for p in (points[1:] if len(points) >= 4 else points)
              if math.isfinite(p[1])]
    return statistics.median(values) if values else None


def _summary(conn: sqlite3.Connection, run: Mapping[str, Any], last_step: int,
             evals: Sequence[str]) -> dict[str, Any]:
    env, rid = run.get("env") or {}, run["run_id"]
    out: dict[str, Any] = {
        "status": run["status"], "processes": env.get("world_size"),
        "device": env.get("device"), "steps": last_step or None,
        "duration (s)": (run["finished"] - run["started"]) if run["finished"] else None,
        "final loss": queries.job_extreme(conn, rid, LOSS, "last"),
        "best loss": queries.job_extreme(conn, rid, LOSS, "min"),
        "throughput, median (samples/s)": _steady_median(
            queries.line_points(conn, rid, SAMPLES_PER_S, shape.JOB)),
        "step time, median (s)": _steady_median(
            queries.line_points(conn, rid, TIME_STEP, shape.JOB)),
    }
    for name in evals:
        out[f"{label(name)}, last"] = queries.job_extreme(conn, rid, name, "last")
    return out


def _diff_table(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every config key, and each key of the plan the run resolved (`resolved.*`), with
    each run's value; `differs` marks the keys whose values differ."""
    flat = [{**shape.flatten(r.get("config") or {}),
             **shape.flatten(r.get("plan") or {}, "resolved")} for r in runs]
    keys = sorted({k for f in flat for k in f})
    return [{"key": k, "values": [f.get(k) for f in flat],
             "differs": len({repr(f.get(k)) for f in flat}) > 1} for k in keys]


def load(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """The runs named in `runs` (comma-separated ids): curves, summaries, config diff."""
    runs = []
    for rid in _ids(args):
        run = queries.run(conn, rid)
        if run is None:
            raise NotFound(f"no run {rid!r} in the store")
        runs.append(run)
    names_of = {r["run_id"]: queries.metric_names(conn, r["run_id"]) for r in runs}
    names = curve_names(sorted({n for ns in names_of.values() for n in ns}))
    evals = [n for n in names if n not in CURVES]
    out_runs, summary = [], {}
    for run in runs:
        lines = series.run_lines(conn, run["run_id"], DEFAULT_POINTS, names=names,
                                 job_only=True, times=True)
        out_runs.append({
            "run_id": run["run_id"], "name": run["name"], "status": run["status"],
            "started": run["started"],
            "series": {n: by_rank[str(shape.JOB)] for n, by_rank in lines["series"].items()}})
        summary[run["run_id"]] = _summary(conn, run, lines["last_step"], evals)
    labels = list(next(iter(summary.values()), {}).keys())
    table = [{"key": k, "values": [summary[r["run_id"]].get(k) for r in runs],
              "differs": len({repr(summary[r["run_id"]].get(k)) for r in runs}) > 1}
             for k in labels]
    out = shape.jsonable({"names": names, "summary": table, "config": _diff_table(runs),
                          "cursor": {"m": queries.max_rowid(conn, "metrics")}})
    out["runs"] = out_runs  # series are JSON-safe already
    return out


def updates(conn: sqlite3.Connection, args: Mapping[str, str],
            cursor: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
    """Job-wide rows of the compared runs' curves committed past `cursor`."""
    top = queries.max_rowid(conn, "metrics")
    if top <= cursor.get("m", 0):
        return None, cursor
    out: dict[str, list] = {}
    done = top
    for rid in _ids(args):
        rows = queries.metric_rows_since(conn, cursor.get("m", 0), [rid], UPDATE_LIMIT)
        if len(rows) == UPDATE_LIMIT:
            done = min(done, rows[-1][0])
        kept = [r[1:] for r in rows if r[2] == shape.JOB and r[0] <= done]
        if kept:
            out[rid] = kept
    return (shape.jsonable({"rows": out}) if out else None), {"m": done}
