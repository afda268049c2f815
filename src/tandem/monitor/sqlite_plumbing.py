"""The run store's SQLite plumbing, shared by every connection to it: the busy timeout,
WAL mode, and write transactions that take the lock up front."""

from __future__ import annotations

import sqlite3
import time

BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another's write lock


def wal_mode(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode. Changing the journal mode needs the file to itself, and
    SQLite answers "database is locked" at once rather than waiting on the busy timeout
    while another connection creates or writes the file: try again until the timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): takes the write lock up front so
    two writers wait on the busy timeout instead of failing to upgrade a read lock."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
