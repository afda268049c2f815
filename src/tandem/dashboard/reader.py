"""Read-only access to the run store: SQLite URI mode=ro, one connection per thread.

The dashboard never writes to the store. Each connection is opened with `mode=ro`
(SQLite itself refuses any write through it) and `PRAGMA query_only`, so not even a
bug in a query can change a run's record. A WAL reader may create the `-wal` and
`-shm` side files when they are missing; the store file itself is never touched.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tandem.monitor.store import SCHEMA_VERSION

# Seconds a read waits for a lock (a writer checkpointing the WAL) before it fails.
BUSY_TIMEOUT_S = 10.0


class StoreUnavailable(ValueError):
    """The store file is missing, or is not a run store this dashboard can read."""


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A new read-only connection to the store at `path` (which must exist)."""
    if not path.is_file():
        raise StoreUnavailable(f"no run store at {path} yet")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                           timeout=BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    conn.execute("PRAGMA query_only=ON")
    return conn


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The store's schema version (None while the file holds no tables yet)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return None
    if "meta" not in tables:
        raise StoreUnavailable(f"tables {sorted(tables)} but no 'meta': not a tandem run store")
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row is not None else 0


class Reader:
    """Read-only connections to one store file, one per thread (sqlite3 objects are
    thread-bound in spirit even when the module allows sharing)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser().resolve()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[sqlite3.Connection] = []

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use; checks the schema version)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        conn = connect_readonly(self.path)
        try:
            found = schema_version(conn)
        except BaseException:
            conn.close()
            raise
        if found is not None and found != SCHEMA_VERSION:
            conn.close()
            raise StoreUnavailable(
                f"{self.path} has run-store schema version {found}; this dashboard reads "
                f"version {SCHEMA_VERSION} (run `tandem runs --store {self.path}` once to "
                "migrate an older store, or upgrade tandem for a newer one)")
        self._local.conn = conn
        with self._lock:
            self._opened.append(conn)
        return conn

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees the same committed state."""
        conn = self.connection()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection this reader opened."""
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            try:
                conn.close()
            except sqlite3.ProgrammingError:  # closed from another thread already
                pass
        self._local = threading.local()
