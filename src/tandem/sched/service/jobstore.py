"""The scheduler's tables in the run store: jobs, their attempts, decisions and resizes.

They live in the same SQLite file as the runs, so one file holds what was asked (jobs),
what was done (attempts, decisions, resizes) and what the jobs measured (runs, metrics,
events). The file's own tables are created by `RunStore` and never touched here; these
tables carry their own schema version (`meta` key `sched_schema_version`).

Every state change is one short transaction that checks the state it expects
(compare-and-set), so the CLI (submit, cancel) and the service can write at the same
time, and a restarted service finds exactly what its predecessor committed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem.monitor.store import BUSY_TIMEOUT_S, RunStore, StoreVersionError
from tandem.sched.service.records import ACTIVE, Attempt, JobRecord
from tandem.status import HOLDING_JOB_STATES, JobStatus

SCHED_SCHEMA_VERSION = 1
VERSION_KEY = "sched_schema_version"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sched_jobs (
    job_id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, name TEXT NOT NULL,
    script TEXT NOT NULL, args TEXT NOT NULL, cwd TEXT NOT NULL, env TEXT NOT NULL,
    min_procs INTEGER NOT NULL, max_procs INTEGER NOT NULL, priority INTEGER NOT NULL,
    adaptive_batch INTEGER NOT NULL, max_batch INTEGER NOT NULL,
    run_name TEXT NOT NULL, run_dir TEXT NOT NULL, submitted REAL NOT NULL,
    state TEXT NOT NULL, procs INTEGER NOT NULL DEFAULT 0, batch INTEGER,
    target_procs INTEGER, target_batch INTEGER, stop_reason TEXT, decided REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0,
    finished REAL, message TEXT);
CREATE INDEX IF NOT EXISTS sched_jobs_state ON sched_jobs (state, seq);
CREATE TABLE IF NOT EXISTS sched_attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, backend TEXT NOT NULL,
    handle TEXT NOT NULL, procs INTEGER NOT NULL, batch INTEGER, launched REAL NOT NULL,
    stop_requested REAL, stop_reason TEXT, ended REAL, exit_code INTEGER, outcome TEXT,
    PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS sched_decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, policy TEXT NOT NULL,
    backend TEXT NOT NULL, allocations TEXT NOT NULL, changes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sched_resizes (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, kind TEXT NOT NULL,
    decided REAL NOT NULL, from_procs INTEGER NOT NULL, to_procs INTEGER NOT NULL,
    from_batch INTEGER, to_batch INTEGER, stopped REAL, stopped_step INTEGER,
    resumed_step INTEGER, training_again REAL, first_window REAL, steps_redone INTEGER,
    closed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS sched_service (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SchedStore:
    """A connection to the scheduler's tables of the run store at `path` (created if missing).

    Like `RunStore`, one connection belongs to one thread.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        with RunStore(self.path):  # the file, WAL mode and the runs' own schema first
            pass
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> SchedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, the lock taken up front (BEGIN IMMEDIATE)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _version(self) -> int | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (VERSION_KEY,)).fetchone()
        return None if row is None else int(row[0])

    def _init_schema(self) -> None:
        if self._version() == SCHED_SCHEMA_VERSION:
            return
        with self.tx() as conn:
            found = self._version()
            if found is None:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("INSERT INTO meta VALUES (?, ?)",
                             (VERSION_KEY, str(SCHED_SCHEMA_VERSION)))
                conn.execute("INSERT OR IGNORE INTO sched_service VALUES ('epoch', ?)",
                             (repr(time.time()),))
            elif found != SCHED_SCHEMA_VERSION:
                raise StoreVersionError(
                    f"{self.path} has scheduler schema version {found}; this tandem reads "
                    f"version {SCHED_SCHEMA_VERSION}. Use a tandem of that version to drain "
                    "its jobs, or give the scheduler another store (--store)")

    # ------------------------------------------------------------------ service facts
    def epoch(self) -> float:
        """Wall time the schedule's clock counts from (fixed when the tables were made)."""
        return float(self.service_value("epoch") or 0.0)

    def service_value(self, key: str) -> str | None:
        """One fact the service recorded about itself (None when absent)."""
        row = self._conn.execute("SELECT value FROM sched_service WHERE key=?",
                                 (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_service_value(self, key: str, value: str) -> None:
        """Record one fact about the service (its pid, backend, API address ...)."""
        with self.tx() as conn:
            conn.execute("INSERT OR REPLACE INTO sched_service VALUES (?, ?)", (key, value))

    # ------------------------------------------------------------------ jobs
    def submit(self, job: JobRecord) -> JobRecord:
        """Add a queued job; its id (`j<seq>`) and run name are given here. Returns it."""
        with self.tx() as conn:
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM sched_jobs").fetchone()[0]
            job_id = f"j{seq}"
            run_name = job.run_name or f"{job.name}-{job_id}"
            clash = conn.execute(
                "SELECT job_id FROM sched_jobs WHERE run_name=? AND run_dir=? AND state IN "
                f"({','.join('?' * len(ACTIVE))})", (run_name, job.run_dir, *ACTIVE)).fetchone()
            if clash is not None:
                raise ValueError(f"--run.name: {run_name!r} in {job.run_dir} is already used "
                                 f"by active job {clash[0]}; two jobs cannot share a run "
                                 "directory")
            conn.execute(
                "INSERT INTO sched_jobs (job_id, seq, name, script, args, cwd, env, min_procs,"
                " max_procs, priority, adaptive_batch, max_batch, run_name, run_dir, "
                "submitted, state) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job_id, seq, job.name, job.script, json.dumps(job.args), job.cwd,
                 json.dumps(job.env), job.min_procs, job.max_procs, job.priority,
                 int(job.adaptive_batch), job.max_batch, run_name, job.run_dir,
                 job.submitted, JobStatus.QUEUED))
        return self.job(job_id)

    def job(self, job_id: str) -> JobRecord:
        """One job by id (`j3` or `3`); ValueError naming the known ids when absent."""
        key = job_id if job_id.startswith("j") else f"j{job_id}"
        row = self._conn.execute("SELECT * FROM sched_jobs WHERE job_id=?", (key,)).fetchone()
        if row is None:
            known = [r[0] for r in self._conn.execute(
                "SELECT job_id FROM sched_jobs ORDER BY seq DESC LIMIT 10")]
            raise ValueError(f"no job {job_id!r} in {self.path}; latest jobs: "
                             f"{', '.join(known) or 'none'}")
        return JobRecord.from_row(row)

    def jobs(self, states: tuple[str, ...] | None = None) -> list[JobRecord]:
        """Jobs in submission order (optionally only those in `states`)."""
        sql, args = "SELECT * FROM sched_jobs", ()
        if states is not None:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            args = states
        return [JobRecord.from_row(r) for r in self._conn.execute(sql + " ORDER BY seq", args)]

    def update_job(self, job_id: str, expect: tuple[str, ...] | None = None,
                   **fields: Any) -> bool:
        """Set `fields` of a job if its state is one of `expect` (any when None)."""
        assert fields and all(k.isidentifier() for k in fields), fields
        sets = ", ".join(f"{k}=?" for k in fields)
        sql, args = f"UPDATE sched_jobs SET {sets} WHERE job_id=?", [*fields.values(), job_id]
        if expect is not None:
            sql += f" AND state IN ({','.join('?' * len(expect))})"
            args += list(expect)
        with self.tx() as conn:
            return conn.execute(sql, args).rowcount == 1

    def cancel(self, job_id: str) -> str:
        """Cancel a job: a queued one at once, an active one by the service (graceful stop).

        Returns what happened, in words. Works whether or not the service runs.
        """
        job = self.job(job_id)
        if self.update_job(job.job_id, (JobStatus.QUEUED,), state=JobStatus.CANCELLED,
                           finished=time.time(), cancel_requested=1,
                           message="cancelled while queued"):
            return f"{job.job_id} cancelled (it was queued)"
        if self.update_job(job.job_id, HOLDING_JOB_STATES, cancel_requested=1):
            return (f"{job.job_id} will stop at its next logging window with a checkpoint "
                    "(the scheduler service does it)")
        return f"{job.job_id} is already {self.job(job.job_id).state}; nothing to cancel"

    # ------------------------------------------------------------------ attempts
    def open_attempt(self, job_id: str, attempt: Attempt, procs: int,
                     batch: int | None) -> bool:
        """Record a launch and mark the job running, if it is still queued (or stopping
        for a relaunch at another size). False (nothing written) if something else has
        changed the job meanwhile: the launch must not go ahead."""
        with self.tx() as conn:
            ok = conn.execute(
                "UPDATE sched_jobs SET state=?, procs=?, batch=?, target_procs=NULL,"
                " target_batch=NULL, stop_reason=NULL WHERE job_id=? AND state IN "
                "(?, ?) AND cancel_requested=0 AND NOT EXISTS (SELECT 1 FROM "
                "sched_attempts WHERE job_id=? AND ended IS NULL)",
                (JobStatus.RUNNING, procs, batch, job_id, JobStatus.QUEUED, JobStatus.STOPPING,
                 job_id)).rowcount == 1
            if ok:
                conn.execute(
                    "INSERT INTO sched_attempts (job_id, attempt, backend, handle, procs, "
                    "batch, launched) VALUES (?,?,?,?,?,?,?)",
                    (job_id, attempt.attempt, attempt.backend, json.dumps(attempt.handle),
                     procs, batch, attempt.launched))
        return ok

    def set_handle(self, job_id: str, attempt: int, handle: dict[str, Any]) -> None:
        """Record how the backend knows an attempt (pid, actor, Slurm job id)."""
        with self.tx() as conn:
            conn.execute("UPDATE sched_attempts SET handle=? WHERE job_id=? AND attempt=?",
                         (json.dumps(handle), job_id, attempt))

    def request_stop(self, job_id: str, attempt: int, reason: str, target_procs: int,
                     target_batch: int | None, decided: float) -> bool:
        """Mark a running job as stopping (graceful), with the size to come back at."""
        with self.tx() as conn:
            ok = conn.execute(
                "UPDATE sched_jobs SET state=?, target_procs=?, target_batch=?, "
                "stop_reason=?, decided=? WHERE job_id=? AND state=?",
                (JobStatus.STOPPING, target_procs, target_batch, reason, decided, job_id,
                 JobStatus.RUNNING)).rowcount == 1
            if ok:
                conn.execute("UPDATE sched_attempts SET stop_requested=?, stop_reason=? "
                             "WHERE job_id=? AND attempt=?", (decided, reason, job_id, attempt))
        return ok

    def close_attempt(self, job_id: str, attempt: int, exit_code: int | None,
                      outcome: str, ended: float) -> None:
        """Record how an attempt ended (exit status, or None when lost without one)."""
        with self.tx() as conn:
            conn.execute("UPDATE sched_attempts SET ended=?, exit_code=?, outcome=? WHERE "
                         "job_id=? AND attempt=? AND ended IS NULL",
                         (ended, exit_code, outcome, job_id, attempt))

    def attempts(self, job_id: str | None = None, open_only: bool = False) -> list[Attempt]:
        """Attempts (of one job, or all), oldest first."""
        sql, args = "SELECT * FROM sched_attempts WHERE 1=1", []
        if job_id is not None:
            sql += " AND job_id=?"
            args.append(job_id)
        if open_only:
            sql += " AND ended IS NULL"
        rows = self._conn.execute(sql + " ORDER BY launched, job_id, attempt", args)
        return [Attempt.from_row(r) for r in rows]

    # ------------------------------------------------------------------ history
    def record_decision(self, policy: str, backend: str, allocations: dict[str, int],
                        changes: dict[str, str]) -> None:
        """Record one decision of the policy: every job's size and what changed."""
        with self.tx() as conn:
            conn.execute("INSERT INTO sched_decisions (time, policy, backend, allocations, "
                         "changes) VALUES (?,?,?,?,?)", (time.time(), policy, backend,
                                                         json.dumps(allocations),
                                                         json.dumps(changes)))

    def decisions(self) -> list[dict[str, Any]]:
        """Every recorded decision, oldest first."""
        rows = self._conn.execute("SELECT * FROM sched_decisions ORDER BY seq").fetchall()
        return [{**dict(r), "allocations": json.loads(r["allocations"]),
                 "changes": json.loads(r["changes"])} for r in rows]

    def record_resize(self, row: dict[str, Any]) -> None:
        """Insert or complete one resize / preemption / resumption record."""
        columns = ", ".join(row)
        with self.tx() as conn:
            conn.execute(f"INSERT OR REPLACE INTO sched_resizes ({columns}) VALUES "
                         f"({','.join('?' * len(row))})", list(row.values()))

    def resizes(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Resize records (of one job, or all), by decision time."""
        sql, args = "SELECT * FROM sched_resizes", ()
        if job_id is not None:
            sql, args = sql + " WHERE job_id=?", (job_id,)
        return [dict(r) for r in self._conn.execute(sql + " ORDER BY decided", args)]
