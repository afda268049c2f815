"""The Tuner page: a tune session's trials, controls, intervals and decision."""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Mapping
from typing import Any

from tandem.dashboard import queries, shape
from tandem.dashboard.view_run import NotFound

Cursor = dict[str, int]


def _session(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any] | None:
    wanted = args.get("session")
    if wanted:
        run = queries.run(conn, wanted)
        if run is None:
            raise NotFound(f"no tune session {wanted!r} in the store")
        return run
    ids = set(queries.tune_sessions(conn))
    newest = [r for r in queries.runs(conn) if r["run_id"] in ids]
    return newest[0] if newest else None


def _sig(run: Mapping[str, Any] | None) -> int:
    return 0 if run is None else zlib.crc32(repr((run["status"], run["finished"])).encode())


def load(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """The sessions, and the chosen one's (or the newest one's) trials and outcome."""
    ids = set(queries.tune_sessions(conn))
    sessions = [{k: r[k] for k in ("run_id", "name", "status", "started")}
                for r in queries.runs(conn) if r["run_id"] in ids]
    run = _session(conn, args)
    out: dict[str, Any] = {"sessions": sessions, "session": None, "trials": [],
                           "cursor": {"t": queries.max_rowid(conn, "tune_trials"),
                                      "s": _sig(run)}}
    if run is not None:
        out["session"] = {k: run[k] for k in ("run_id", "name", "status", "started",
                                              "finished", "config", "plan", "summary")}
        out["trials"] = queries.trials(conn, run["run_id"])
    return shape.jsonable(out)


def updates(conn: sqlite3.Connection, args: Mapping[str, str],
            cursor: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
    """Trials recorded (or re-recorded) past `cursor`, and the session's state."""
    run = _session(conn, args)
    top = queries.max_rowid(conn, "tune_trials")
    new = {"t": top, "s": _sig(run)}
    if run is None or new == cursor:
        return None, new
    out: dict[str, Any] = {}
    if top > cursor.get("t", 0):
        fresh = queries.trials(conn, run["run_id"], cursor.get("t", 0))
        if fresh:
            out["trials"] = fresh
    if new["s"] != cursor.get("s"):
        out["session"] = {k: run[k] for k in ("status", "finished", "summary")}
    return (shape.jsonable(out) if out else None), new
