"""The run store: one SQLite file (WAL) holding runs, their metrics, events and trials.

Writers keep transactions short and readers (the report, `tandem runs`, a tuner) may
open the same file from another process while a run writes: WAL lets one writer and
many readers proceed together, and `timeout` makes a briefly locked writer wait
instead of failing.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tandem.monitor.sqlite_plumbing import BUSY_TIMEOUT_S, Transaction, wal_mode
from tandem.status import RunStatus

log = logging.getLogger("tandem")

STORE_ENV = "TANDEM_STORE"  # where runs are recorded when nothing else says
STORE_FILE = "tandem.db"
DEFAULT_RUN_DIR = "runs"
SCHEMA_VERSION = 4
STATUSES = tuple(RunStatus)
# Who made a run: the user, or the tuner (a trial of a candidate plan, or a control /
# placebo run measuring a cause or the noise); `tandem runs` lists user runs by default.
RUN_KINDS = ("user", "trial", "control")

MetricRow = tuple[int, int, str, float, float]  # step, rank, name, value, time

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, name TEXT NOT NULL, started REAL NOT NULL, finished REAL,
    status TEXT NOT NULL, config TEXT NOT NULL, plan TEXT NOT NULL, env TEXT NOT NULL,
    summary TEXT, kind TEXT NOT NULL DEFAULT 'user');
CREATE INDEX IF NOT EXISTS runs_name ON runs (name, started);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, name TEXT NOT NULL,
    value REAL, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_cover ON metrics (run_id, name, step, rank, value, time);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, kind TEXT NOT NULL,
    message TEXT NOT NULL, value REAL, threshold REAL, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, step);
CREATE TABLE IF NOT EXISTS tune_trials (
    run_id TEXT NOT NULL, trial_id TEXT NOT NULL, plan TEXT NOT NULL, status TEXT NOT NULL,
    figures TEXT NOT NULL, decision TEXT, time REAL NOT NULL,
    PRIMARY KEY (run_id, trial_id));
"""



def _rename_trials(conn: sqlite3.Connection) -> None:
    """Version 1 -> 2: `trials` becomes `tune_trials`, so that an Optuna study (whose own
    table is called `trials`) can live in the same file."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(trials)")}
    if "figures" in columns:  # ours, not Optuna's
        conn.execute("ALTER TABLE trials RENAME TO tune_trials")


def _covering_index(conn: sqlite3.Connection) -> None:
    """Version 2 -> 3: a run's series are read from one index alone (run, name, step and
    the values), not by a lookup of every row in the table: a run of 200k rows reads in a
    fraction of the time."""
    conn.execute("CREATE INDEX IF NOT EXISTS metrics_cover ON metrics "
                 "(run_id, name, step, rank, value, time)")
    conn.execute("DROP INDEX IF EXISTS metrics_run_name_step")


def _run_kinds(conn: sqlite3.Connection) -> None:
    """Version 3 -> 4: runs get a `kind` (user / trial / control); every run before it
    counts as the user's."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "kind" not in columns:
        conn.execute("ALTER TABLE runs ADD COLUMN kind TEXT NOT NULL DEFAULT 'user'")


# version v -> the function that upgrades a v store to v + 1, inside one transaction.
# A store older than the oldest key is refused.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _rename_trials,
                                                               2: _covering_index,
                                                               3: _run_kinds}


def store_location(explicit: str | Path | None = None,
                   run_dir: str | Path = DEFAULT_RUN_DIR) -> Path:
    """Where the run store is: `explicit` (monitor.store, --store), else TANDEM_STORE, else
    `<run_dir>/tandem.db`. The one place that decides it."""
    chosen = explicit or os.environ.get(STORE_ENV) or Path(run_dir) / STORE_FILE
    return Path(chosen).expanduser().resolve()


def add_store_argument(parser: argparse.ArgumentParser, use: str = "") -> None:
    """The `--store` flag of every command that reads or writes the run store, resolved by
    `store_location` (`use`: what else the command keeps there, said in its help)."""
    parser.add_argument("--store", default=None,
                        help=f"the run store{use} (default: ${STORE_ENV}, else "
                             f"{DEFAULT_RUN_DIR}/{STORE_FILE})")


# Whether a runs row recorded any metric (it trained), read from the covering index.
_TRAINED = "EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = runs.run_id)"


class StoreVersionError(ValueError):
    """The store file was written by another schema version than this code reads."""


def _dumps(value: Any) -> str:
    # default=str: an env or config value that JSON does not know (a Path, a dtype)
    # is kept as its text rather than failing the run. NaN stays NaN (Python's JSON
    # reads it back): a summary whose final loss is NaN must say so.
    return json.dumps(value, default=str)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _value(x: float | None) -> float:
    # SQLite stores NaN as NULL; a NaN loss must read back as NaN, not vanish.
    return math.nan if x is None else float(x)


class RunStore:
    """A connection to the run store at `path` (created with its schema if missing).

    The connection belongs to the thread that created the RunStore (sqlite3 objects
    are thread-bound): another thread or process opens its own RunStore on the file.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            wal_mode(self._conn)
            # NORMAL is durable across a process crash in WAL mode; only a power loss
            # can drop the last transactions, which metrics can afford.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        """Close the connection (the file stays)."""
        self._conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> Transaction:
        return Transaction(self._conn)

    def _found_version(self) -> int | None:
        """The file's schema version (None for an empty file). Takes no write lock."""
        tables = {r[0] for r in self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return None
        if "meta" not in tables:
            raise StoreVersionError(
                f"{self.path} holds tables {sorted(tables)} but no 'meta' table: it is "
                "not a tandem run store (or one from before schema versions); use "
                "another path")
        row = self._conn.execute(
            "SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row is not None else 0

    def _init_schema(self) -> None:
        # The common case, a current store, is settled by a read: a reader opening the
        # file while a run holds the write lock must not wait for it.
        if self._found_version() == SCHEMA_VERSION:
            return
        with self._tx():
            found = self._found_version()  # again: another process may have created it
            if found is not None:
                self._upgrade(found)
                return
            # Statement by statement: executescript() would commit the open
            # transaction first and let two creators race.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._conn.execute(statement)
            self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                               (str(SCHEMA_VERSION),))

    def _upgrade(self, found: int) -> None:
        if found > SCHEMA_VERSION:
            raise StoreVersionError(
                f"{self.path} has run-store schema version {found}, newer than this tandem "
                f"reads (version {SCHEMA_VERSION}); upgrade tandem or use another store")
        version = found
        while version < SCHEMA_VERSION:
            migrate = MIGRATIONS.get(version)
            if migrate is None:
                raise StoreVersionError(
                    f"{self.path} has run-store schema version {found}, which this tandem "
                    f"cannot migrate to version {SCHEMA_VERSION} (migrations exist from "
                    f"versions {sorted(MIGRATIONS) or 'none'}); move the file aside")
            log.warning("run store %s: migrating schema version %d to %d; the store is "
                        "locked until it is done, which takes a minute or more on a store "
                        "of millions of rows", self.path, version, version + 1)
            migrate(self._conn)
            version += 1
            log.info("run store %s migrated to schema version %d", self.path, version)
        if version != found:
            self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                               (str(version),))

    # ------------------------------------------------------------------ writers
    def start_run(self, run_id: str, name: str, config: dict[str, Any], plan: dict[str, Any],
                  env: dict[str, Any], kind: str | None = None) -> None:
        """Record that run `run_id` started; `kind` (RUN_KINDS) defaults to the config's
        run.kind, else "user".

        Starting an id that exists is a resume: the run is marked running again, its
        config, plan and env are replaced, its metrics and `started` time are kept (the
        trainer records the resume itself, with the step it resumed from).
        """
        if not run_id:
            raise ValueError("run_id must be a non-empty string")
        kind = kind or (config.get("run") or {}).get("kind") or "user"
        if kind not in RUN_KINDS:
            raise ValueError(f"run.kind {kind!r}: must be one of {', '.join(RUN_KINDS)}")
        now = time.time()
        with self._tx():
            existing = self._conn.execute(
                "SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if existing is None:
                self._conn.execute(
                    "INSERT INTO runs (run_id, name, started, finished, status, config, plan, "
                    "env, summary, kind) VALUES (?, ?, ?, NULL, ?, ?, ?, ?, NULL, ?)",
                    (run_id, name, now, RunStatus.RUNNING, _dumps(config), _dumps(plan),
                     _dumps(env), kind))
                return
            self._conn.execute(
                "UPDATE runs SET name=?, finished=NULL, status=?, config=?, plan=?, "
                "env=?, kind=? WHERE run_id=?",
                (name, RunStatus.RUNNING, _dumps(config), _dumps(plan), _dumps(env), kind,
                 run_id))

    def log_metrics(self, run_id: str, rows: Iterable[MetricRow]) -> int:
        """Append metric rows (step, rank, name, value, time) in one transaction.

        Rank -1 means the figure is for the whole job. Returns the number of rows.
        """
        data = [(run_id, int(s), int(r), str(n), float(v), float(t)) for s, r, n, v, t in rows]
        if data:
            with self._tx():
                self._conn.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)", data)
        return len(data)

    def log_event(self, run_id: str, step: int, rank: int, kind: str, message: str,
                  value: float | None = None, threshold: float | None = None,
                  time_s: float | None = None) -> None:
        """Record one event (a NaN, a spike, a restart, a target reached ...)."""
        self.log_events(run_id, [(step, rank, kind, message, value, threshold,
                                  time.time() if time_s is None else time_s)])

    def log_events(self, run_id: str, rows: Iterable[tuple[int, int, str, str, float | None,
                                                            float | None, float]]) -> int:
        """Append events (step, rank, kind, message, value, threshold, time) in one go."""
        data = [(run_id, int(s), int(r), str(k), str(m), v, th, float(t))
                for s, r, k, m, v, th, t in rows]
        if data:
            with self._tx():
                self._conn.executemany(
                    "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", data)
        return len(data)

    def finish_run(self, run_id: str, status: str, summary: dict[str, Any]) -> None:
        """Record how run `run_id` ended: status (completed/failed/preempted) and summary."""
        if status not in STATUSES or status == RunStatus.RUNNING:
            allowed = ", ".join(s for s in STATUSES if s != RunStatus.RUNNING)
            raise ValueError(f"finish_run status must be one of {allowed}; got {status!r}")
        with self._tx():
            cur = self._conn.execute(
                "UPDATE runs SET finished=?, status=?, summary=? WHERE run_id=?",
                (time.time(), status, _dumps(summary), run_id))
        if cur.rowcount == 0:
            raise ValueError(f"finish_run: no run with id {run_id!r} in {self.path}")

    def log_trial(self, run_id: str, trial_id: str, plan: dict[str, Any], status: str,
                  figures: dict[str, Any], decision: str | None = None) -> None:
        """Record (or update) one tuner trial of run `run_id`."""
        with self._tx():
            self._conn.execute(
                "INSERT OR REPLACE INTO tune_trials VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, trial_id, _dumps(plan), status, _dumps(figures), decision,
                 time.time()))

    # ------------------------------------------------------------------ readers
    @staticmethod
    def _run_dict(row: sqlite3.Row) -> dict[str, Any]:
        out = dict(row)
        for key in ("config", "plan", "env", "summary"):
            out[key] = _loads(out[key])
        return out

    def runs(self) -> list[dict[str, Any]]:
        """Every run, oldest first."""
        rows = self._conn.execute("SELECT * FROM runs ORDER BY started, run_id").fetchall()
        return [self._run_dict(r) for r in rows]

    def select_runs(self, name: str | None = None, status: str | None = None,
                    kind: str | None = "user", limit: int | None = None) -> list[dict[str, Any]]:
        """Runs newest first, those whose name matches the glob `name` (`mnist*`), with
        `status` and `kind` (None: any), at most `limit` of them."""
        for field, value, allowed in (("status", status, STATUSES), ("kind", kind, RUN_KINDS)):
            if value is not None and value not in allowed:
                raise ValueError(f"--{field} {value!r}: must be one of {', '.join(allowed)}")
        if limit is not None and limit < 1:
            raise ValueError(f"--limit {limit}: must be at least 1")
        where, args = ["1"], []
        for clause, value in (("name GLOB ?", name), ("status=?", status), ("kind=?", kind)):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = f"SELECT * FROM runs WHERE {' AND '.join(where)} ORDER BY started DESC, run_id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._run_dict(r) for r in self._conn.execute(sql, args)]

    def delete_run(self, run_id: str) -> None:
        """Remove run `run_id` from the store: its row, metrics, events and trials."""
        with self._tx():
            for table in ("metrics", "events", "tune_trials", "runs"):
                self._conn.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))

    def latest_run(self) -> dict[str, Any]:
        """The run to show when none is named: the newest user run that trained (recorded
        a metric), else the newest run; ValueError when the store holds none."""
        row = self._conn.execute(
            f"SELECT * FROM runs ORDER BY kind='user' DESC, {_TRAINED} DESC, started DESC, "
            "run_id DESC LIMIT 1").fetchone()
        if row is None:
            raise ValueError(f"the run store {self.path} holds no run yet")
        return self._run_dict(row)

    def run(self, run_id_or_name_prefix: str) -> dict[str, Any]:
        """One run, by exact id, exact name (the newest that trained, else the newest), or
        unique prefix of an id."""
        key = run_id_or_name_prefix
        row = self._conn.execute("SELECT * FROM runs WHERE run_id=?", (key,)).fetchone()
        if row is None:
            # A name's newest row may be a start that stopped before its first step (a
            # store written before those were left out): the run that trained is meant.
            row = self._conn.execute(
                f"SELECT * FROM runs WHERE name=? ORDER BY {_TRAINED} DESC, started DESC "
                "LIMIT 1", (key,)).fetchone()
        if row is not None:
            return self._run_dict(row)
        escaped = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._conn.execute(
            "SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY started",
            (escaped + "%",)).fetchall()
        # LIKE ignores ASCII case; an id prefix must match exactly.
        rows = [r for r in rows if r["run_id"].startswith(key)]
        if len(rows) == 1:
            return self._run_dict(rows[0])
        if rows:
            ids = ", ".join(r["run_id"] for r in rows[:10])
            raise ValueError(f"run {key!r} is ambiguous: it prefixes {len(rows)} run ids "
                             f"({ids}); give more characters or the exact name")
        known = [f"{r['name']} ({r['run_id']})" for r in self.runs()[-10:]]
        raise ValueError(f"no run with id, id prefix or name {key!r} in {self.path}; "
                         f"latest runs: {', '.join(known) or 'none'}")

    def metrics(self, run_id: str, name: str | None = None,
                rank: int | None = None) -> list[dict[str, Any]]:
        """Metric rows of a run (optionally one name, one rank), by name, step, rank."""
        sql = "SELECT step, rank, name, value, time FROM metrics WHERE run_id=?"
        args: list[Any] = [run_id]
        if name is not None:
            sql += " AND name=?"
            args.append(name)
        if rank is not None:
            sql += " AND rank=?"
            args.append(rank)
        rows = self._conn.execute(sql + " ORDER BY name, step, rank, time", args).fetchall()
        return [{"step": r[0], "rank": r[1], "name": r[2], "value": _value(r[3]),
                 "time": r[4]} for r in rows]

    def metric_names(self, run_id: str) -> list[str]:
        """The distinct metric names a run recorded, sorted."""
        rows = self._conn.execute(
            "SELECT DISTINCT name FROM metrics WHERE run_id=? ORDER BY name", (run_id,))
        return [r[0] for r in rows]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """Events of a run, in order of time."""
        rows = self._conn.execute(
            "SELECT step, rank, kind, message, value, threshold, time FROM events "
            "WHERE run_id=? ORDER BY time, step", (run_id,)).fetchall()
        return [dict(r) for r in rows]

    def trials(self, run_id: str) -> list[dict[str, Any]]:
        """Tuner trials of a run, in order of time."""
        rows = self._conn.execute(
            "SELECT * FROM tune_trials WHERE run_id=? ORDER BY time", (run_id,)).fetchall()
        out = []
        for r in rows:
            d = dict(r)
            d["plan"], d["figures"] = _loads(d["plan"]), _loads(d["figures"])
            out.append(d)
        return out


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception:  # environment() must never fail, torch or not
        return {"torch": None, "device": "cpu", "cuda": None}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "device": "cpu"}
    try:
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name(torch.cuda.current_device())
            info["device_count"] = torch.cuda.device_count()
    except Exception as exc:  # a broken driver must not stop the run
        log.debug("environment: CUDA query failed: %s", exc)
    return info


def environment(device: str | None = None, world_size: int | None = None) -> dict[str, Any]:
    """What the run ran on: torch, device, world size, host, git commit, python. Never fails.

    `device` and `world_size` override what is detected (the runtime knows better once
    the process group exists).
    """
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    env.update(_torch_info())
    if device is not None:
        env["device"] = device
    try:
        env["world_size"] = (world_size if world_size is not None
                             else int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        env["world_size"] = 1
    # Processes on this host (torchrun sets it): world / local is the hosts the run spans.
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local and local.isdigit():
        env["local_world_size"] = int(local)
    elif env["world_size"] == 1:
        env["local_world_size"] = 1
    try:
        env["host"] = socket.gethostname()
    except OSError:
        env["host"] = None
    env["cpu_count"] = os.cpu_count()
    # run.dir is relative to it: where the run's folder is, read from another folder
    env["cwd"] = os.getcwd()
    env["script"] = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    env["git_commit"] = _git_commit()
    return env
