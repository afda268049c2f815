"""The Run page: one run's curves, phases, ranks, events, diagnosis, system and config."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
import zlib
from collections.abc import Mapping
from typing import Any

from tandem.analyze.diagnosis.diagnose import diagnose_run
from tandem.analyze.diagnosis.find_health import (
    START_WINDOWS,
    UNSTABLE_EVENT_KINDS,
    event_kind,
    small_outlier,
    start_levels,
)
from tandem.analyze.report.compression import tradeoff_html
from tandem.dashboard import queries, series, shape
from tandem.dashboard.downsample import DEFAULT_COLUMNS, DEFAULT_POINTS
from tandem.monitor.catalogue import GRAD_NORM, LOSS
from tandem.status import RunStatus

Cursor = dict[str, int]
# Rows sent in one update at most; the rest follow in the next ones at once.
UPDATE_LIMIT = 50_000
# A live run's diagnosis reads its latest rows, at most about this many (whole logging
# windows): what the run does now, at a cost that stays put as the run grows. A finished
# run's reads every row, once (the server keeps it).
LIVE_ROWS = 100_000


class NotFound(LookupError):
    """The page names a run (or session) the store does not hold."""


def _run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    run = queries.run(conn, run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r} in the store")
    return run


def _int_arg(args: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = args.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key}: {raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ValueError(f"{key}: {value} is outside [{low}, {high}]")
    return value


def _state(run: Mapping[str, Any]) -> dict[str, Any]:
    return {"status": run["status"], "finished": run["finished"],
            "summary": run.get("summary")}


def _sig(run: Mapping[str, Any]) -> int:
    return zlib.crc32(repr((run["status"], run["finished"])).encode())


def _judged(conn: sqlite3.Connection, run_id: str,
            events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events`, each outlier marked `small` as the health finding judges it (on the run's
    starting loss and gradient norm), so the page colours it as the diagnosis speaks."""
    if not any(event_kind(e["kind"]) in UNSTABLE_EVENT_KINDS for e in events):
        return events
    groups = {name: queries.first_windows(conn, run_id, name, START_WINDOWS)
              for name in (LOSS, GRAD_NORM)}
    loss0, grad0 = start_levels(groups)
    for e in events:
        e["small"] = small_outlier(e, loss0, grad0)
    return events


def load(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """Everything the page draws, downsampled, and the cursor of what it holds."""
    run = _run(conn, args["run_id"])
    points = _int_arg(args, "points", DEFAULT_POINTS, 4, 100_000)
    columns = _int_arg(args, "columns", DEFAULT_COLUMNS, 1, 10_000)
    cursor = {"m": queries.max_rowid(conn, "metrics"), "e": queries.max_rowid(conn, "events"),
              "s": _sig(run)}
    lines = series.run_lines(conn, run["run_id"], points, columns, times=False)
    events = _judged(conn, run["run_id"], queries.events(conn, run["run_id"]))
    out = shape.jsonable({
        "run": {k: run[k] for k in ("run_id", "name", "started", "finished", "status",
                                    "config", "plan", "env", "summary")},
        "cursor": cursor, "points": points, "columns": columns,
        "last_time": lines["last_time"], "events": events,
        "segments": shape.segments(events, run["started"], lines["last_step"]),
    })
    # Already JSON-safe, and the bulk of the page: not walked again.
    out["series"], out["heatmaps"] = lines["series"], lines["heatmaps"]
    # The newest `tandem compress` experiment on this run, drawn as the report draws it.
    out["compression"] = tradeoff_html(queries.trials(conn, run["run_id"]))
    return out


def updates(conn: sqlite3.Connection, args: Mapping[str, str],
            cursor: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
    """The run's rows and events committed past `cursor`, and its state if it changed."""
    run = _run(conn, args["run_id"])
    top_m, top_e = queries.max_rowid(conn, "metrics"), queries.max_rowid(conn, "events")
    new = dict(cursor)
    out: dict[str, Any] = {}
    rows_out: list[list[Any]] | None = None  # JSON-safe already, and most of the message
    if top_m > cursor.get("m", 0):
        rows = queries.metric_rows_since(conn, cursor.get("m", 0), [run["run_id"]],
                                         UPDATE_LIMIT)
        new["m"] = rows[-1][0] if len(rows) == UPDATE_LIMIT else top_m
        if rows:
            rows_out = shape.metric_rows(rows)
            out["more"] = len(rows) == UPDATE_LIMIT
    if top_e > cursor.get("e", 0):
        out["events"] = _judged(conn, run["run_id"],
                                queries.events(conn, run["run_id"], cursor.get("e", 0)))
        new["e"] = top_e
    if _sig(run) != cursor.get("s"):
        out["run"] = _state(run)
        new["s"] = _sig(run)
    if not out:
        return None, new
    payload = shape.jsonable(out)
    if rows_out is not None:
        payload["rows"] = rows_out
    return payload, new


def latest_rows(conn: sqlite3.Connection, run_id: str) -> list[queries.MetricRow] | None:
    """The run's last LIVE_ROWS rows less those of their first step (a window cut short),
    or None when the run holds no more than LIVE_ROWS rows."""
    rows = queries.latest_metric_rows(conn, run_id, LIVE_ROWS + 1)
    if len(rows) <= LIVE_ROWS:
        return None
    cut = rows[0][1]  # the step the limit fell in: some of its rows were left out
    return rows[next((i for i, r in enumerate(rows) if r[1] != cut), len(rows)):]


def diagnose_rows(conn: sqlite3.Connection, run: Mapping[str, Any],
                  rows: list[queries.MetricRow]) -> list[Any]:
    """tandem.analyze.diagnosis.diagnose on these metric rows of `run`, with all of its events."""
    metrics = [{"step": r[1], "rank": r[2], "name": r[3], "value": r[4], "time": r[5]}
               for r in rows]
    return diagnose_run(run, metrics, queries.events(conn, run["run_id"]))


def findings(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """tandem.analyze.diagnosis.diagnose's findings on the run's rows, every field of each, and the
    CPU seconds they took (`cost_s`: the page paces its next request by it).

    A live run longer than LIVE_ROWS is diagnosed on its latest windows (`latest`: their
    first and last step): who is slow now, not over the run's whole history, and at a
    cost that does not grow with the run; its events are all read (the instabilities
    among them stay named). A finished run is diagnosed on every row, as its report is.
    """
    started = time.thread_time()
    run = _run(conn, args["run_id"])
    latest = latest_rows(conn, run["run_id"]) if run["status"] == RunStatus.RUNNING else None
    rows = latest if latest is not None else queries.metric_rows(conn, run["run_id"])
    found = diagnose_rows(conn, run, rows)
    as_dicts = [dataclasses.asdict(f) if dataclasses.is_dataclass(f) else dict(vars(f))
                for f in found]
    return shape.jsonable({"findings": as_dicts, "rows": len(rows),
                           "latest": [rows[0][1], rows[-1][1]] if latest else None,
                           "cursor": queries.max_rowid(conn, "metrics"),
                           "cost_s": round(time.thread_time() - started, 4)})
