"""A dashboard nobody looks at costs the run beside it almost nothing: it polls the store
only while a page streams, and its server loop wakes once a second; both still react at
once (a page opening, a stop)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from tandem.monitor.store import RunStore
from tests.dashboard.conftest import POLL_S, counted_watcher


def _commit(store: Path, step: int) -> None:
    with RunStore(store) as s:
        s.log_metrics("live-1", [(step, -1, "loss", 1.0, time.time())])


async def _until(predicate, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.01)
    return True


def test_the_store_is_polled_only_while_a_stream_is_open(store: Path) -> None:
    async def scenario() -> dict[str, object]:
        reader, watcher, checks = counted_watcher(store)
        task = asyncio.create_task(watcher.run())
        out: dict[str, object] = {}
        await asyncio.sleep(10 * POLL_S)
        out["idle"] = len(checks)
        _commit(store, 500)  # while nobody watches
        seen = watcher.version
        with watcher.watching():
            # a stream opening is told to look again (for what came while none polled)
            out["woken"] = await _until(lambda: watcher.version > seen, 2.0)
            seen = watcher.version
            _commit(store, 510)
            out["saw_commit"] = await _until(lambda: watcher.version > seen, 2.0)
            before = len(checks)
            await asyncio.sleep(10 * POLL_S)
            out["open"] = len(checks) - before
        await asyncio.sleep(2 * POLL_S)  # a poll already under way may finish
        after = len(checks)
        await asyncio.sleep(10 * POLL_S)
        out["closed"] = len(checks) - after
        watcher.stop()
        await asyncio.wait_for(task, 2.0)
        reader.close()
        return out

    # On a thread of its own: Playwright's sync API may have left this one a running loop.
    got: dict[str, object] = {}
    runner = threading.Thread(target=lambda: got.update(asyncio.run(scenario())))
    runner.start()
    runner.join(30)
    assert got["idle"] == 0 and got["closed"] == 0, got
    assert got["woken"] and got["saw_commit"], got
    assert got["open"] >= 5, got  # about one check per POLL_S while the stream is open


def test_an_idle_server_wakes_once_a_second_and_stops_at_once(store: Path, serve) -> None:
    server = serve(store)
    first = server.server.ticks
    time.sleep(2.0)
    woke = server.server.ticks - first
    assert 1 <= woke <= 3, woke  # uvicorn's own loop: 20 in 2 s
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 0.5
    assert not server._thread.is_alive()
