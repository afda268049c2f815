"""The Scheduler page: the scheduler's jobs, its queue, the processes each job held over
time (its attempts), the resizes and preemptions carried out, and the latest decision.

The cursor holds the newest rowid the page has of sched_jobs ("n"), sched_attempts
("a"), sched_resizes ("r"), sched_decisions ("d") and runs ("u"), a checksum of the
service's facts ("v"), and, per job that can still change (queued, running, stopping),
a checksum of its row and its attempts under the job's own id ("j3"). An update resends
a job when it is new, when its checksum moved (it changed, or it finished: finished
jobs never change again) or when its run appeared; the cursor grows with the active
jobs only.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.dashboard import queries, sched_queries
from tandem.dashboard.shape import jsonable
from tandem.status import JobStatus

Cursor = dict[str, int]
_TABLE_KEYS = {"n": "sched_jobs", "a": "sched_attempts", "r": "sched_resizes",
               "d": "sched_decisions", "u": "runs"}


def _checksum(value: Any) -> int:
    return zlib.crc32(repr(value).encode())


def job_row(job: Mapping[str, Any], attempts: Sequence[Mapping[str, Any]],
            run_ids: Mapping[str, str]) -> dict[str, Any]:
    """One job as the page shows it: its row, its attempts, when it first started, its
    completion time (finished - submitted, once finished) and its run's id (None until
    the run is in the store)."""
    finished = job["finished"]
    return {**job, "adaptive_batch": bool(job["adaptive_batch"]),
            "cancel_requested": bool(job["cancel_requested"]),
            "started": attempts[0]["launched"] if attempts else None,
            "jct": finished - job["submitted"] if finished is not None else None,
            "attempts": [dict(a) for a in attempts],
            "run_id": run_ids.get(job["run_name"])}


def resize_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One resize / preemption / recovery record, with the seconds from the decision to
    the job's stop and to its training again (where recorded)."""
    out = {k: v for k, v in row.items() if k != "rowid"}
    out["closed"] = bool(row["closed"])
    decided = row["decided"]
    out["stop_s"] = row["stopped"] - decided if row["stopped"] is not None else None
    out["to_training_s"] = (row["training_again"] - decided
                            if row["training_again"] is not None else None)
    return out


def _job_rows(conn: sqlite3.Connection, ids: Sequence[str] | None) -> list[dict[str, Any]]:
    found = sched_queries.jobs(conn, ids)
    attempts = sched_queries.attempts(conn, ids)
    run_ids = sched_queries.run_ids_by_name(conn, sorted({j["run_name"] for j in found}))
    return [job_row(j, attempts.get(j["job_id"], []), run_ids) for j in found]


def _active_checksums(conn: sqlite3.Connection) -> Cursor:
    ids = sched_queries.job_ids(conn, sched_queries.ACTIVE_STATES)
    attempts = sched_queries.attempts(conn, ids)
    return {j["job_id"]: _checksum((sorted(j.items()), attempts.get(j["job_id"], [])))
            for j in sched_queries.jobs(conn, ids)}


def _cursor(conn: sqlite3.Connection) -> Cursor:
    out = {key: queries.max_rowid(conn, table) for key, table in _TABLE_KEYS.items()}
    out["v"] = _checksum(sched_queries.service_facts(conn))
    return {**out, **_active_checksums(conn)}


def load(conn: sqlite3.Connection, args: Mapping[str, str]) -> dict[str, Any]:
    """Every job with its attempts, the queue, the resize records, the latest decision,
    the service's facts, and the cursor of what the page holds."""
    present = sched_queries.has_scheduler(conn)
    return jsonable({
        "scheduler": present,
        "jobs": _job_rows(conn, None) if present else [],
        "queue": sched_queries.job_ids(conn, (JobStatus.QUEUED,)),
        "resizes": [resize_row(r) for r in sched_queries.resizes(conn)],
        "decision": sched_queries.latest_decision(conn),
        "service": sched_queries.service_facts(conn),
        "cursor": _cursor(conn), "now": time.time()})


def _changed_jobs(conn: sqlite3.Connection, cursor: Cursor, top: Cursor) -> set[str]:
    """Ids of the jobs to resend: new, changed or finished since `cursor`, or whose run
    appeared."""
    changed = sched_queries.job_ids_past(conn, cursor.get("n", 0), "sched_jobs")
    changed |= sched_queries.job_ids_past(conn, cursor.get("a", 0), "sched_attempts")
    # Keys that are not table keys are job ids: those active at the cursor, and now.
    before = {k: v for k, v in cursor.items() if k not in _TABLE_KEYS and k != "v"}
    after = {k: v for k, v in top.items() if k not in _TABLE_KEYS and k != "v"}
    changed |= {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    if top["u"] > cursor.get("u", 0):
        names = sched_queries.run_names_past(conn, cursor.get("u", 0))
        changed |= sched_queries.job_ids_of_runs(conn, sorted(names))
    return changed


def updates(conn: sqlite3.Connection, args: Mapping[str, str],
            cursor: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
    """What changed past `cursor`: jobs (each whole, with its attempts) and the queue,
    new or completed resize records, the latest decision, the service's facts."""
    if not sched_queries.has_scheduler(conn):
        return None, cursor
    top = _cursor(conn)
    if top == cursor:
        return None, cursor
    out: dict[str, Any] = {}
    changed = _changed_jobs(conn, cursor, top)
    if changed:
        out["jobs"] = _job_rows(conn, sorted(changed))
        out["queue"] = sched_queries.job_ids(conn, (JobStatus.QUEUED,))
    if top["r"] > cursor.get("r", 0):
        out["resizes"] = [resize_row(r) for r in sched_queries.resizes(conn, cursor.get("r", 0))]
    if top["d"] != cursor.get("d"):
        out["decision"] = sched_queries.latest_decision(conn)
    if top["v"] != cursor.get("v"):
        out["service"] = sched_queries.service_facts(conn)
    if not out:
        return None, top
    return jsonable({**out, "scheduler": True, "now": time.time()}), top
