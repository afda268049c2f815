"""A live page's update reads the rows committed since its cursor: its cost follows those
rows, not the run's or the store's length (counted in SQLite's own VM steps)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from tandem.dashboard import queries
from tandem.dashboard.reader import connect_readonly
from tandem.monitor.store import RunStore

NEW = 60  # rows committed since the page's cursor


def _store(path: Path, old_rows: int) -> int:
    """A store whose live run has `old_rows` rows, another run as many, then NEW rows of
    the live run; the cursor before those NEW rows."""
    with RunStore(path) as store:
        for run in ("other", "live"):
            store.start_run(run, run, {}, {}, {})
            store.log_metrics(run, [(i // 20, i % 2, f"m{i % 20}", float(i), 1e9 + i)
                                    for i in range(old_rows)])
    conn = connect_readonly(path)
    try:
        cursor = queries.max_rowid(conn, "metrics")
    finally:
        conn.close()
    with RunStore(path) as store:
        store.log_metrics("live", [(10**6 + i, 0, "loss", 1.0, 2e9 + i) for i in range(NEW)])
    return cursor


def _steps(path: Path, query: Callable[[sqlite3.Connection], object]) -> tuple[int, object]:
    """SQLite VM steps (in hundreds) that `query` takes, and what it returned."""
    conn = connect_readonly(path)
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        got = query(conn)
    finally:
        conn.close()
    return count[0], got


def test_tail_reads_cost_the_new_rows_not_the_run(tmp_path: Path) -> None:
    small, big = tmp_path / "small.db", tmp_path / "big.db"
    cursors = {small: _store(small, 2_000), big: _store(big, 40_000)}
    reads: dict[str, Callable[[sqlite3.Connection, int], object]] = {
        "rows of the live run": lambda c, cur: queries.metric_rows_since(c, cur, ["live"]),
        "rows of every run": lambda c, cur: queries.metric_rows_since(c, cur),
        "runs with new rows": lambda c, cur: queries.runs_with_rows_since(c, cur),
        "latest rows of the live run (its diagnosis)":
            lambda c, cur: queries.latest_metric_rows(c, "live", NEW),
    }
    for what, read in reads.items():
        (s_steps, s_got), (b_steps, b_got) = (
            _steps(p, lambda c, p=p, read=read: read(c, cursors[p])) for p in (small, big))
        if what == "runs with new rows":
            assert s_got == b_got == ["live"]
        else:
            assert len(s_got) == len(b_got) == NEW  # type: ignore[arg-type]
            assert {r[3] for r in b_got} == {"loss"}  # type: ignore[union-attr]
        # 20 times the old rows; the tail read may not take even twice the steps
        assert b_steps <= 2 * s_steps + 2, (what, s_steps, b_steps)
