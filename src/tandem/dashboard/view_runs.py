"""The Runs page: the user's runs (or the tuner's, or all), newest first, with their
status and latest figures."""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Mapping
from typing import Any

from tandem.dashboard import queries
from tandem.dashboard.shape import jsonable
from tandem.monitor.catalogue import LOSS, TIME_STEP
from tandem.monitor.store import RUN_KINDS
from tandem.status import RunStatus

Cursor = dict[str, int]
# A run still marked running is shown live while it wrote something this recently; a
# run whose process was killed stays running in the store and is shown as silent.
LIVE_AFTER_S = 300.0
# The page's kind filter (`?kind=`): the user's own runs by default; a tune session adds
# dozens of trial and control runs that would bury them.
KINDS: dict[str, tuple[str, ...] | None] = {
    "user": ("user",), "tuner": ("trial", "control"), "all": None,
    **{k: (k,) for k in RUN_KINDS if k != "user"}}
DEFAULT_KIND = "user"


def kinds_of(args: Mapping[str, str]) -> tuple[str, ...] | None:
    """The run kinds `?kind=` asks for (None: every kind)."""
    wanted = args.get("kind") or DEFAULT_KIND
    if wanted not in KINDS:
        raise ValueError(f"kind {wanted!r}: must be one of {', '.join(KINDS)}")
    return KINDS[wanted]


def kind_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """How many runs each choice of the kind filter shows ({"user": 12, "tuner": 77, ...})."""
    held = queries.run_kinds(conn)
    return {choice: sum(n for k, n in held.items() if kinds is None or k in kinds)
            for choice, kinds in KINDS.items()}


def _states_sig(conn: sqlite3.Connection) -> int:
    return zlib.crc32(repr(sorted(queries.run_states(conn))).encode())


def run_row(conn: sqlite3.Connection, run: Mapping[str, Any], tuned: set[str],
            now: float) -> dict[str, Any]:
    """One line of the runs table."""
    env, plan, summary = run.get("env") or {}, run.get("plan") or {}, run.get("summary") or {}
    loss = queries.last_row(conn, run["run_id"], LOSS)
    last = loss or queries.last_row(conn, run["run_id"], TIME_STEP)
    activity = max(t for t in (run["started"], last and last["time"],
                               queries.last_event_time(conn, run["run_id"])) if t)
    running = run["status"] == RunStatus.RUNNING
    return jsonable({
        "run_id": run["run_id"], "name": run["name"], "status": run["status"],
        "live": running and now - activity <= LIVE_AFTER_S,
        "silent_s": now - activity if running else None,
        "started": run["started"], "finished": run["finished"],
        "world_size": env.get("world_size"), "device": env.get("device"),
        # every size it ran at: the store's env holds only the last segment's
        "sizes": queries.segment_sizes(conn, run["run_id"]),
        "host": env.get("host"), "strategy": plan.get("strategy"),
        "steps": summary.get("steps", last["step"] if last else None),
        "loss": loss["value"] if loss else None,
        "tune": run["run_id"] in tuned, "last_time": activity, "kind": run["kind"],
    })


def load(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """The runs of the kind asked for, newest first, how many runs of each kind the
    store holds, and the cursor of what the page has seen."""
    now = time.time()
    tuned = set(queries.tune_sessions(conn))
    rows = [run_row(conn, r, tuned, now) for r in queries.runs(conn, kinds_of(args))]
    cursor = {"m": queries.max_rowid(conn, "metrics"), "r": queries.max_rowid(conn, "runs"),
              "e": queries.max_rowid(conn, "events"), "s": _states_sig(conn)}
    return {"runs": rows, "kind": args.get("kind") or DEFAULT_KIND,
            "kind_counts": kind_counts(conn), "cursor": cursor, "now": now}


def updates(conn: sqlite3.Connection, args: Mapping[str, str],
            cursor: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
    """The runs that changed since `cursor`: new runs, new rows, new statuses."""
    top = {"m": queries.max_rowid(conn, "metrics"), "r": queries.max_rowid(conn, "runs"),
           "e": queries.max_rowid(conn, "events"), "s": _states_sig(conn)}
    if top == cursor:
        return None, cursor
    every = queries.runs(conn, kinds_of(args))
    if top["s"] != cursor.get("s"):
        changed = every  # a status changed in place: resend every run's line
    else:
        ids = set(queries.runs_with_rows_since(conn, cursor.get("m", 0)))
        ids |= {r["run_id"] for r in every if r["rowid"] > cursor.get("r", 0)}
        if top["e"] != cursor.get("e"):
            ids |= {r["run_id"] for r in every if r["status"] == RunStatus.RUNNING}
        changed = [r for r in every if r["run_id"] in ids]
    now = time.time()
    tuned = set(queries.tune_sessions(conn))
    return {"runs": [run_row(conn, r, tuned, now) for r in changed], "now": now,
            "kind_counts": kind_counts(conn)}, top
