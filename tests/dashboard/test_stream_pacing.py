"""A stream beside a live run: after each message it looks again when its gap is over,
without the store being polled, and its small queries run on the event loop (a worker
thread only for the first query and for one that took long)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tandem.dashboard import queries, stream
from tandem.dashboard.reader import Reader
from tandem.dashboard.stream import Watcher
from tandem.monitor.store import RunStore
from tests.dashboard.conftest import POLL_S, counted_watcher

GAP_S = 0.2  # the streams' gap in these tests


def _in_thread(scenario) -> dict[str, Any]:
    """asyncio.run(scenario()) on a thread of its own (Playwright's sync API may have left
    this one a running loop)."""
    got: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: got.update(asyncio.run(scenario())))
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the scenario did not end"
    return got


class _Rows:
    """An Updates function: the metric rows past the cursor; notes the thread of each call
    and can be made to burn CPU for one call."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.burn_next = 0.0

    def __call__(self, conn, args, cursor):
        self.threads.append(threading.get_ident())
        if self.burn_next:
            end = time.thread_time() + self.burn_next
            while time.thread_time() < end:
                pass
            self.burn_next = 0.0
        top = queries.max_rowid(conn, "metrics")
        if top <= cursor.get("m", 0):
            return None, cursor
        rows = queries.metric_rows_since(conn, cursor.get("m", 0))
        return {"rows": [r[1] for r in rows]}, {"m": top}


def _writer(store: Path, steps: range, every_s: float, stop: threading.Event) -> None:
    with RunStore(store) as s:
        for step in steps:
            if stop.is_set():
                return
            s.log_metrics("live-1", [(step, -1, "loss", 1.0, time.time())])
            time.sleep(every_s)


def test_a_stream_beside_a_live_run_needs_no_polling(store: Path) -> None:
    """Commits every 20 ms for 2 s: the stream's messages carry every row, at least a gap
    apart, and the watcher checks the store only while the stream found nothing new (the
    old stream had it polled all along: 2 s / POLL_S = 40 checks)."""

    async def scenario() -> dict[str, Any]:
        reader, watcher, checks = counted_watcher(store)
        task = asyncio.create_task(watcher.run())
        updates = _Rows()
        with reader.snapshot() as conn:
            cursor = {"m": queries.max_rowid(conn, "metrics")}
        stop = threading.Event()
        steps = range(1000, 1100)
        writer = threading.Thread(target=_writer, args=(store, steps, 0.02, stop))
        got: list[int] = []
        arrived: list[float] = []
        events = stream.events(watcher, reader, updates, {}, cursor, min_gap_s=GAP_S)
        writer.start()
        async for text in events:
            if text.startswith("id:"):
                got += json.loads(text.split("data: ", 1)[1])["rows"]
                arrived.append(time.monotonic())
                if got and got[-1] == steps[-1]:
                    break
            if len(arrived) > 200:
                break
        stop.set()
        await asyncio.to_thread(writer.join)
        writing = (arrived[0], arrived[-1])
        polled = [t for t in checks if writing[0] <= t <= writing[1]]
        await events.aclose()
        watcher.stop()
        await asyncio.wait_for(task, 2.0)
        reader.close()
        return {"got": got, "arrived": arrived, "polled": len(polled),
                "span": writing[1] - writing[0]}

    out = _in_thread(scenario)
    assert out["got"] == list(range(1000, 1100))
    gaps = [b - a for a, b in zip(out["arrived"], out["arrived"][1:], strict=False)]
    assert all(g >= GAP_S * 0.8 for g in gaps), gaps
    assert out["span"] > 1.0, out["span"]
    # While the run commits, each look after a gap finds rows: the store is not polled
    # (a check or two where a look found nothing is allowed).
    assert out["polled"] <= 3, (out["polled"], out["span"] / POLL_S)


def test_small_queries_run_on_the_loop_and_a_long_one_on_a_worker(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The placement follows each query's CPU time against stream.INLINE_S. A threshold
    # that no small query comes near on any host (they take well under a millisecond on a
    # fast one) and a burn of three times it keep the outcome off the host's speed; the
    # shipped threshold is a tuning choice, not what this checks.
    monkeypatch.setattr(stream, "INLINE_S", 0.1)

    async def scenario() -> dict[str, Any]:
        reader = Reader(store)
        watcher = Watcher(reader, POLL_S)
        task = asyncio.create_task(watcher.run())
        updates = _Rows()
        loop_thread = threading.get_ident()
        stop = threading.Event()
        writer = threading.Thread(target=_writer,
                                  args=(store, range(2000, 2100), 0.02, stop))
        events = stream.events(watcher, reader, updates, {}, {"m": 0}, min_gap_s=GAP_S)
        writer.start()
        messages = 0
        async for text in events:
            if text.startswith("id:"):
                messages += 1
                if messages == 3:  # the next query burns CPU: the one after, on a worker
                    updates.burn_next = 3 * stream.INLINE_S
                if messages == 6:
                    break
        stop.set()
        await asyncio.to_thread(writer.join)
        await events.aclose()
        watcher.stop()
        await asyncio.wait_for(task, 2.0)
        reader.close()
        return {"on_loop": [t == loop_thread for t in updates.threads]}

    on_loop = _in_thread(scenario)["on_loop"]
    # The first query (a page catching up) goes to a worker, then small ones stay on the
    # loop; the query that burned CPU ran on the loop, the next one on a worker, and the
    # one after that back on the loop.
    assert on_loop[0] is False, on_loop
    assert all(on_loop[1:4]), on_loop
    assert on_loop[4] is False and all(on_loop[5:]), on_loop
