"""The SQL the dashboard runs against the run store's tables (runs, metrics, events,
tune_trials), read-only. The scheduler's tables have theirs in sched_queries.py.

Every table is append-only except `runs` (a run's status and summary change in place),
so SQLite's implicit rowid orders rows by commit: a page that has seen rows up to a
rowid asks only for rows past it. `INSERT OR REPLACE` of a tuner trial gives the new
version a new rowid, so a re-recorded trial arrives as a new row too.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from tandem.analyze.report.compression import COMPRESS_PREFIX

# rowid, step, rank, name, value, time
MetricRow = tuple[int, int, int, str, float, float]
_RUN_JSON = ("config", "plan", "env", "summary")
# Tables whose newest rowid a page may ask for (names checked: they go into the SQL text).
ROWID_TABLES = ("metrics", "events", "tune_trials", "runs", "sched_jobs", "sched_attempts",
                "sched_decisions", "sched_resizes")


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _value(x: float | None) -> float:
    # The store writes NaN as NULL (SQLite has no NaN); a NaN loss must stay NaN.
    return math.nan if x is None else float(x)


def _run(row: sqlite3.Row | tuple, columns: Sequence[str]) -> dict[str, Any]:
    out = dict(zip(columns, row, strict=True))
    for key in _RUN_JSON:
        if key in out:
            out[key] = _loads(out[key])
    return out


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    """Whether the store has table `name`."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                        (name,)).fetchone() is not None


def runs(conn: sqlite3.Connection, kinds: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The runs of `kinds` (user, trial, control; None: every run) with their JSON
    columns decoded, newest first, plus their `rowid`."""
    where = "" if kinds is None else f"WHERE kind IN ({','.join('?' * len(kinds))}) "
    sql = f"SELECT rowid, * FROM runs {where}ORDER BY started DESC, run_id DESC"  # noqa: S608 - ?s
    cur = conn.execute(sql, list(kinds or ()))
    columns = [d[0] for d in cur.description]
    return [_run(r, columns) for r in cur.fetchall()]


def run_kinds(conn: sqlite3.Connection) -> dict[str, int]:
    """How many runs of each kind the store holds ({"user": 12, "trial": 70, ...})."""
    return {k: int(n) for k, n in conn.execute("SELECT kind, COUNT(*) FROM runs GROUP BY kind")}


def run(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    """One run by exact id, else the latest run with that name; None if neither."""
    cur = conn.execute("SELECT rowid, * FROM runs WHERE run_id=?", (key,))
    row = cur.fetchone()
    if row is None:
        cur = conn.execute("SELECT rowid, * FROM runs WHERE name=? ORDER BY started DESC "
                           "LIMIT 1", (key,))
        row = cur.fetchone()
    return None if row is None else _run(row, [d[0] for d in cur.description])


def run_states(conn: sqlite3.Connection) -> list[tuple[str, str, float | None]]:
    """(run_id, status, finished) of every run: what changes in place."""
    return [tuple(r) for r in conn.execute("SELECT run_id, status, finished FROM runs")]


def max_rowid(conn: sqlite3.Connection, table: str) -> int:
    """The largest rowid in `table` (0 when empty or absent)."""
    if table not in ROWID_TABLES or not has_table(conn, table):
        return 0
    row = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()  # noqa: S608 - fixed names
    return int(row[0] or 0)


def metric_names(conn: sqlite3.Connection, run_id: str) -> list[str]:
    """A run's distinct metric names, sorted: one index seek per name, not a scan."""
    names: list[str] = []
    last = ""
    while True:
        row = conn.execute("SELECT MIN(name) FROM metrics WHERE run_id=? AND name>?",
                           (run_id, last)).fetchone()
        if row is None or row[0] is None:
            return names
        last = row[0]
        names.append(last)


def metric_rows(conn: sqlite3.Connection, run_id: str,
                names: Sequence[str] | None = None) -> list[MetricRow]:
    """A run's metric rows (all names, or `names`), by name, step, rank."""
    sql = "SELECT rowid, step, rank, name, value, time FROM metrics WHERE run_id=?"
    args: list[Any] = [run_id]
    if names is not None:
        if not names:
            return []
        sql += f" AND name IN ({','.join('?' * len(names))})"
        args += list(names)
    rows = conn.execute(sql + " ORDER BY name, step, rank, time", args).fetchall()
    return [(r[0], r[1], r[2], r[3], _value(r[4]), r[5]) for r in rows]


def metric_rows_since(conn: sqlite3.Connection, cursor: int,
                      run_ids: Sequence[str] | None = None,
                      limit: int = 50_000) -> list[MetricRow]:
    """Metric rows committed after rowid `cursor` (of some runs, or all), oldest first.

    A range scan of the rowid b-tree: its cost follows the new rows, not the store.
    `NOT INDEXED` keeps it one: given a run id, SQLite's planner would otherwise walk
    every row of the run through the covering index and sort them by rowid, a cost that
    grows with the run on every update of a live page.
    """
    sql = "SELECT rowid, step, rank, name, value, time FROM metrics NOT INDEXED WHERE rowid>?"
    args: list[Any] = [cursor]
    if run_ids is not None:
        sql += f" AND run_id IN ({','.join('?' * len(run_ids))})"
        args += list(run_ids)
    rows = conn.execute(sql + " ORDER BY rowid LIMIT ?", [*args, limit]).fetchall()
    return [(r[0], r[1], r[2], r[3], _value(r[4]), r[5]) for r in rows]


def latest_metric_rows(conn: sqlite3.Connection, run_id: str, limit: int) -> list[MetricRow]:
    """A run's last `limit` metric rows, in the order they were committed.

    The rowid b-tree read backwards (`NOT INDEXED`): it stops after `limit` rows of the
    run, so its cost follows `limit` (and the other runs' rows among them), not the run.
    """
    rows = conn.execute(
        "SELECT rowid, step, rank, name, value, time FROM metrics NOT INDEXED "
        "WHERE run_id=? ORDER BY rowid DESC LIMIT ?", (run_id, limit)).fetchall()
    return [(r[0], r[1], r[2], r[3], _value(r[4]), r[5]) for r in reversed(rows)]


def runs_with_rows_since(conn: sqlite3.Connection, cursor: int) -> list[str]:
    """Ids of the runs that have metric rows past rowid `cursor` (a range scan of the
    rowid b-tree: without `NOT INDEXED`, SQLite answers DISTINCT by scanning the whole
    covering index, every row of every run)."""
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT run_id FROM metrics NOT INDEXED WHERE rowid>?", (cursor,))]


def last_row(conn: sqlite3.Connection, run_id: str, name: str) -> dict[str, Any] | None:
    """The latest-step row of one metric of a run (an index seek)."""
    row = conn.execute("SELECT step, value, time FROM metrics WHERE run_id=? AND name=? "
                       "ORDER BY step DESC, rowid DESC LIMIT 1", (run_id, name)).fetchone()
    return None if row is None else {"step": row[0], "value": _value(row[1]), "time": row[2]}


def first_windows(conn: sqlite3.Connection, run_id: str, name: str,
                  windows: int) -> list[dict[str, Any]]:
    """The rows of one metric of a run at its first `windows` logged steps (index seeks)."""
    rows = conn.execute(
        "SELECT step, rank, value FROM metrics WHERE run_id=? AND name=? AND step IN "
        "(SELECT DISTINCT step FROM metrics WHERE run_id=? AND name=? ORDER BY step LIMIT ?)",
        (run_id, name, run_id, name, windows)).fetchall()
    return [{"step": r[0], "rank": r[1], "value": _value(r[2])} for r in rows]


def events(conn: sqlite3.Connection, run_id: str, cursor: int = 0) -> list[dict[str, Any]]:
    """A run's events past rowid `cursor`, oldest first, each with its `rowid`."""
    cur = conn.execute(
        "SELECT rowid, step, rank, kind, message, value, threshold, time FROM events "
        "WHERE run_id=? AND rowid>? ORDER BY rowid", (run_id, cursor))
    columns = [d[0] for d in cur.description]
    return [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]


def segment_sizes(conn: sqlite3.Connection, run_id: str) -> list[int]:
    """The process counts of a run's segments (its `segment` events), in order, a size
    repeated by consecutive segments given once: [2, 1, 2] for a run resized twice."""
    sizes: list[int] = []
    for (value,) in conn.execute("SELECT value FROM events WHERE run_id=? AND kind='segment' "
                                 "ORDER BY time, rowid", (run_id,)):
        if value is not None and (not sizes or sizes[-1] != int(value)):
            sizes.append(int(value))
    return sizes


def last_event_time(conn: sqlite3.Connection, run_id: str) -> float | None:
    """When a run's latest event was recorded."""
    row = conn.execute("SELECT MAX(time) FROM events WHERE run_id=?", (run_id,)).fetchone()
    return None if row is None else row[0]


def tune_sessions(conn: sqlite3.Connection) -> list[str]:
    """Ids of the runs that hold tuner trials (not only a compression experiment's)."""
    if not has_table(conn, "tune_trials"):
        return []
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT run_id FROM tune_trials WHERE trial_id NOT LIKE ?",
        (COMPRESS_PREFIX + "%",))]


def trials(conn: sqlite3.Connection, run_id: str, cursor: int = 0) -> list[dict[str, Any]]:
    """A tune session's trials recorded past rowid `cursor`, in order of recording."""
    if not has_table(conn, "tune_trials"):
        return []
    cur = conn.execute("SELECT rowid, * FROM tune_trials WHERE run_id=? AND rowid>? "
                       "ORDER BY rowid", (run_id, cursor))
    columns = [d[0] for d in cur.description]
    out = []
    for r in cur.fetchall():
        d = dict(zip(columns, r, strict=True))
        d["plan"], d["figures"] = _loads(d["plan"]), _loads(d["figures"])
        out.append(d)
    return out


def line_points(conn: sqlite3.Connection, run_id: str, name: str,
                rank: int) -> list[tuple[int, float, float]]:
    """Every (step, value, time) of one line, by step (repeats in the order written)."""
    rows = conn.execute("SELECT step, value, time FROM metrics WHERE run_id=? AND name=? "
                        "AND rank=? ORDER BY step, rowid", (run_id, name, rank)).fetchall()
    return [(r[0], _value(r[1]), r[2]) for r in rows]


def name_points(conn: sqlite3.Connection, run_id: str,
                name: str) -> dict[int, list[tuple[int, float, float]]]:
    """rank -> every (step, value, time) of one metric of a run, by step (repeats in the
    order written), read in the order of the (run_id, name, step) index: no sort."""
    out: dict[int, list[tuple[int, float, float]]] = {}
    for rank, step, value, time in conn.execute(
            "SELECT rank, step, value, time FROM metrics WHERE run_id=? AND name=? "
            "ORDER BY step, rowid", (run_id, name)):
        out.setdefault(rank, []).append((step, math.nan if value is None else value, time))
    return out


def job_extreme(conn: sqlite3.Connection, run_id: str, name: str,
                which: str) -> float | None:
    """The job-wide value of `name` at its last finite step ("last") or its "min"."""
    if which not in ("last", "min"):
        raise ValueError(f"which: {which!r} is not 'last' or 'min'")
    order = "step DESC" if which == "last" else "value ASC"
    row = conn.execute(f"SELECT value FROM metrics WHERE run_id=? AND name=? AND rank=-1 "  # noqa: S608
                       f"AND value IS NOT NULL ORDER BY {order} LIMIT 1",
                       (run_id, name)).fetchone()
    return None if row is None else float(row[0])
