"""The SQL the dashboard runs against the scheduler's tables (sched_jobs, sched_attempts,
sched_decisions, sched_resizes, sched_service; their schema is in
tandem.sched.service.jobstore), read-only.

The tables exist only once a scheduler (or `tandem submit`) has used the store; every
function here answers "nothing" without them, so a page never needs `SchedStore` (which
would create them). A job's `env` is never read: it may hold secrets given to the job.

Jobs and attempts change in place (state, size, end); decisions are appended and a
resize record is re-recorded with `INSERT OR REPLACE`, which gives it a new rowid, so
rowids order decisions and resize records by commit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from tandem.dashboard.queries import has_table
from tandem.status import ACTIVE_JOB_STATES

JOB_COLUMNS = ("job_id", "seq", "name", "script", "min_procs", "max_procs", "priority",
               "adaptive_batch", "max_batch", "run_name", "submitted", "state", "procs",
               "batch", "target_procs", "target_batch", "stop_reason", "decided",
               "cancel_requested", "failures", "finished", "message")
ATTEMPT_COLUMNS = ("job_id", "attempt", "backend", "procs", "batch", "launched",
                   "stop_requested", "stop_reason", "ended", "exit_code", "outcome")
ACTIVE_STATES = ACTIVE_JOB_STATES


def has_scheduler(conn: sqlite3.Connection) -> bool:
    """Whether a scheduler has used this store (its jobs table exists)."""
    return has_table(conn, "sched_jobs")


def _rows(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    columns = [d[0] for d in cur.description]
    return [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]


def _in(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values))


def jobs(conn: sqlite3.Connection,
         job_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Jobs in submission order: every one, or those in `job_ids`."""
    if not has_scheduler(conn):
        return []
    sql = f"SELECT {', '.join(JOB_COLUMNS)} FROM sched_jobs"  # noqa: S608
    args: list[Any] = []
    if job_ids is not None:
        if not job_ids:
            return []
        sql += f" WHERE job_id IN ({_in(job_ids)})"
        args = list(job_ids)
    return _rows(conn.execute(sql + " ORDER BY seq", args))


def job_ids_past(conn: sqlite3.Connection, rowid: int, table: str) -> set[str]:
    """Ids of the jobs with rows past `rowid` in sched_jobs or sched_attempts (a range
    scan of the rowid b-tree; an index on job_id would have SQLite scan all of it)."""
    if table not in ("sched_jobs", "sched_attempts") or not has_table(conn, table):
        return set()
    return {r[0] for r in conn.execute(
        f"SELECT DISTINCT job_id FROM {table} NOT INDEXED WHERE rowid>?",  # noqa: S608
        (rowid,))}


def job_ids(conn: sqlite3.Connection, states: Sequence[str]) -> list[str]:
    """Ids of the jobs in `states`, in submission order."""
    if not has_scheduler(conn) or not states:
        return []
    return [r[0] for r in conn.execute(
        f"SELECT job_id FROM sched_jobs WHERE state IN ({_in(states)}) ORDER BY seq",
        list(states))]


def job_ids_of_runs(conn: sqlite3.Connection, run_names: Sequence[str]) -> set[str]:
    """Ids of the jobs whose run is named in `run_names`."""
    if not has_scheduler(conn) or not run_names:
        return set()
    return {r[0] for r in conn.execute(
        f"SELECT job_id FROM sched_jobs WHERE run_name IN ({_in(run_names)})",
        list(run_names))}


def attempts(conn: sqlite3.Connection,
             job_ids: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """job_id -> its attempts, oldest first (of every job, or of `job_ids`)."""
    if not has_table(conn, "sched_attempts"):
        return {}
    sql = f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM sched_attempts"  # noqa: S608
    args: list[Any] = []
    if job_ids is not None:
        if not job_ids:
            return {}
        sql += f" WHERE job_id IN ({_in(job_ids)})"
        args = list(job_ids)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(conn.execute(sql + " ORDER BY job_id, attempt", args)):
        out.setdefault(row["job_id"], []).append(row)
    return out


def resizes(conn: sqlite3.Connection, after_rowid: int = 0) -> list[dict[str, Any]]:
    """Resize, preemption and recovery records recorded past `after_rowid`, by decision
    time, each with its `rowid`."""
    if not has_table(conn, "sched_resizes"):
        return []
    return _rows(conn.execute("SELECT rowid, * FROM sched_resizes WHERE rowid>? "
                              "ORDER BY decided, rowid", (after_rowid,)))


def latest_decision(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The policy's latest recorded decision (sizes and changes decoded), and how many
    decisions the store holds (`count`); None before the first."""
    if not has_table(conn, "sched_decisions"):
        return None
    cur = conn.execute("SELECT seq, time, policy, backend, allocations, changes, "
                       "(SELECT COUNT(*) FROM sched_decisions) AS count "
                       "FROM sched_decisions ORDER BY seq DESC LIMIT 1")
    rows = _rows(cur)
    if not rows:
        return None
    row = rows[0]
    row["allocations"], row["changes"] = json.loads(row["allocations"]), json.loads(
        row["changes"])
    return row


def service_facts(conn: sqlite3.Connection) -> dict[str, str]:
    """What the service recorded about itself (its pid, backend, slots, policy; the
    schedule's epoch)."""
    if not has_table(conn, "sched_service"):
        return {}
    return {k: v for k, v in conn.execute("SELECT key, value FROM sched_service ORDER BY key")}


def run_ids_by_name(conn: sqlite3.Connection, names: Sequence[str]) -> dict[str, str]:
    """Run name -> id of the latest run with that name, for the names the runs table has."""
    if not names or not has_table(conn, "runs"):
        return {}
    out: dict[str, str] = {}
    for name, run_id in conn.execute(
            f"SELECT name, run_id FROM runs WHERE name IN ({_in(names)}) "
            "ORDER BY started, run_id", list(names)):
        out[name] = run_id  # the latest started wins
    return out


def run_names_past(conn: sqlite3.Connection, rowid: int) -> set[str]:
    """Names of the runs recorded past `rowid` (a job's run appears when it starts)."""
    if not has_table(conn, "runs"):
        return set()
    return {r[0] for r in conn.execute("SELECT name FROM runs WHERE rowid>?", (rowid,))}
