"""Server-sent events: each open page gets only new rows, at most one message per gap.

A stream that has just sent rows sleeps MIN_GAP_S and then asks its page for the rows
past its cursor, polling nothing: beside a run that logs several windows a second there is
always something new by then, and a run that commits many times a second (one window of
each rank, liveness, events) costs one query and one redraw of the page per gap, not one
per commit. A row committed meanwhile waits at most MIN_GAP_S, which keeps it on the
page within a second.

Only a stream that found nothing new waits for the store to change. One task per server
asks SQLite's `PRAGMA data_version` (a read of the WAL index, no query) every POLL_S while
some stream waits, and wakes them all when another connection has committed: an idle store
costs one pragma per POLL_S whatever the number of open pages, and a server whose pages
all stream a live run, or with no page open, polls nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool

from tandem.dashboard.reader import Reader, StoreUnavailable, connect_readonly

log = logging.getLogger("tandem")

POLL_S = 0.2
MIN_GAP_S = 0.7  # between two messages of one stream (commits in between are coalesced)
HEARTBEAT_S = 15.0  # a comment line this often finds a page that went away
# A stream's query runs on the event loop when its last one took less CPU than this: handing
# a small query to a worker thread and back (a futex and a self-pipe write, each woken
# side's select) cost more than the query; a big one (a page catching up) goes to a
# worker, so that it does not hold up the other pages' requests.
INLINE_S = 0.002

Cursor = dict[str, int]
Updates = Callable[[sqlite3.Connection, Mapping[str, str], Cursor],
                   tuple[dict[str, Any] | None, Cursor]]


class Watcher:
    """Counts the commits other connections made to the store (polled while a stream
    waits for one: `watching()`)."""

    def __init__(self, reader: Reader, poll_s: float = POLL_S) -> None:
        self.reader, self.poll_s = reader, poll_s
        self.version = 0
        self.stopped = False
        self.waiting = 0  # streams waiting for a change; with none, nothing is polled
        self._changed = asyncio.Event()
        self._opened = asyncio.Event()  # set when a stream starts waiting (or on stop)
        self._conn: sqlite3.Connection | None = None
        self._last: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """While inside, this stream needs the store polled."""
        self.waiting += 1
        self._opened.set()
        try:
            yield
        finally:
            self.waiting -= 1

    def _check(self) -> bool:
        """Whether the store changed since the last check. The first check (the file
        appeared, the watcher started, or it woke with a stream opening) says it did:
        its baseline is read now, so the streams look again for what came before it."""
        if self._conn is None:
            try:
                self._conn = connect_readonly(self.reader.path)
            except StoreUnavailable:
                return False
        current = self._conn.execute("PRAGMA data_version").fetchone()[0]
        changed = current != self._last
        self._last = current
        return changed

    async def run(self) -> None:
        """Poll until stop() while a stream waits; wake the waiting streams on each
        change."""
        self._loop = asyncio.get_running_loop()
        try:
            while not self.stopped:
                if not self.waiting:
                    self._opened.clear()
                    await self._opened.wait()
                    self._last = None  # commits made meanwhile: the streams look again
                    continue
                try:
                    changed = self._check()
                except sqlite3.Error as err:  # a locked or replaced file: try again
                    log.debug("dashboard: polling the store failed: %s", err)
                    changed = False
                if changed:
                    self._bump()
                await asyncio.sleep(self.poll_s)
        finally:
            if self._conn is not None:
                self._conn.close()

    def _bump(self) -> None:
        self.version += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def stop(self) -> None:
        """End run() and every stream waiting in wait()."""
        self.stopped = True
        self._opened.set()
        self._bump()

    def stop_threadsafe(self) -> None:
        """stop(), from any thread (or a signal handler)."""
        self.stopped = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.stop)

    async def wait(self, seen: int, timeout: float) -> int:
        """The version once it passes `seen` (or at the timeout), the store polled
        meanwhile."""
        if self.version == seen:
            with self.watching():
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout)
                except TimeoutError:
                    pass
        return self.version


def parse_cursor(text: str | None) -> Cursor:
    """'m=12&e=3' -> {'m': 12, 'e': 3}; bad parts are ignored (the page then gets more)."""
    out: Cursor = {}
    for key, value in parse_qsl(text or ""):
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def message(payload: Mapping[str, Any], cursor: Cursor) -> str:
    """One SSE message: the cursor as its id (a reconnect resumes from it), JSON data."""
    data = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return f"id: {urlencode(cursor)}\nevent: update\ndata: {data}\n\n"


async def events(watcher: Watcher, reader: Reader, updates: Updates,
                 args: Mapping[str, str], cursor: Cursor,
                 min_gap_s: float = MIN_GAP_S) -> AsyncIterator[str]:
    """The stream of one page: updates past `cursor` whenever the store changes, at most
    one message per `min_gap_s` (a backlog's parts excepted): after a message it looks
    again when the gap is over, and only when that finds nothing does it wait for the
    store to change."""

    took = math.inf  # the last query's time: the first one (a catch-up) on a worker

    def step(current: Cursor) -> tuple[dict[str, Any] | None, Cursor]:
        nonlocal took
        started = time.thread_time()
        try:
            with reader.snapshot() as conn:
                return updates(conn, args, current)
        finally:
            took = time.thread_time() - started

    yield ": connected\n\n"
    while not watcher.stopped:
        seen = watcher.version  # before the query: a commit during it wakes the wait
        try:
            if took < INLINE_S:
                payload, cursor = step(cursor)
            else:
                payload, cursor = await run_in_threadpool(step, cursor)
        except StoreUnavailable:
            payload = None
        if payload is not None:
            yield message(payload, cursor)
            if not payload.get("more"):  # a backlog's next part goes at once
                await asyncio.sleep(min_gap_s)  # what commits meanwhile goes in one message
        elif await watcher.wait(seen, HEARTBEAT_S) == seen and not watcher.stopped:
            yield ": ping\n\n"
