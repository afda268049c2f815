"""A background writer into the run store, so the training loop never waits on SQLite."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tandem.monitor.store import MetricRow, RunStore

log = logging.getLogger("tandem")

# Rows are written when this many are pending or this many seconds have passed since
# the last write, whichever comes first: few, short transactions keep readers and
# other writers of the file moving.
BATCH_ROWS = 256
BATCH_SECONDS = 0.5
# Past this many queued items (a stalled disk), new ones are dropped and counted
# rather than letting memory grow or the loop block.
QUEUE_LIMIT = 200_000

EventRow = tuple[int, int, str, str, float | None, float | None, float]


@dataclass
class _Flush:
    done: threading.Event


_STOP = object()


class StoreWriter:
    """Queue metrics and events from the training loop; a thread writes them in batches.

    The thread opens its own RunStore (sqlite3 connections are thread-bound). Any error
    while writing is logged and the batch dropped: a metrics failure never stops
    training. `close()` drains what is queued and joins the thread; it is idempotent.
    """

    def __init__(self, store_path: Path | str, run_id: str) -> None:
        self.store_path = Path(store_path)
        self.run_id = run_id
        self._queue: queue.Queue[object] = queue.Queue(maxsize=QUEUE_LIMIT)
        self._closed = False
        self._lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        self._thread = threading.Thread(target=self._run, name=f"tandem-store-{run_id}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ loop side
    def _put(self, item: object) -> None:
        if self._closed:
            self._drop("the writer is closed")
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(f"the queue holds {QUEUE_LIMIT} items (is the disk stalled?)")

    def _drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 10_000 == 0:
            log.warning("run store: dropped %d item(s) because %s", self.dropped, why)

    def metric(self, step: int, rank: int, name: str, value: float,
               time_s: float | None = None) -> None:
        """Queue one metric value (rank -1: the whole job). Returns at once.

        Pass a Python float: converting a CUDA tensor here would wait for the device.
        """
        self._put(("m", (int(step), int(rank), name, float(value),
                         time.time() if time_s is None else time_s)))

    def event(self, step: int, rank: int, kind: str, message: str,
              value: float | None = None, threshold: float | None = None) -> None:
        """Queue one event. Returns at once."""
        self._put(("e", (int(step), int(rank), kind, message,
                         None if value is None else float(value),
                         None if threshold is None else float(threshold), time.time())))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued so far is written; False if `timeout` passed."""
        if self._closed or not self._thread.is_alive():
            return False
        marker = _Flush(threading.Event())
        self._put(marker)
        return marker.done.wait(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Write what is queued, stop the thread and close its connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            # Blocking put: the stop marker must get in even when the queue is full.
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.warning("run store writer is stuck with a full queue; %s may miss rows",
                        self.store_path)
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("run store writer did not finish within %.0f s; %s may miss rows",
                        timeout, self.store_path)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------- thread side
    def _run(self) -> None:
        store: RunStore | None = None
        metrics: list[MetricRow] = []
        events: list[EventRow] = []
        flushes: list[_Flush] = []
        last_write = time.monotonic()
        stop = False
        while not stop:
            wait = max(0.0, BATCH_SECONDS - (time.monotonic() - last_write))
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _STOP:
                stop = True
            elif isinstance(item, _Flush):
                flushes.append(item)
            elif isinstance(item, tuple):
                kind, row = item
                if kind == "m":
                    metrics.append(row)
                else:
                    events.append(row)
            # Events are rare and are what a post-mortem needs (a SIGKILL loses what is
            # still queued): they are written at once, with the metrics queued so far.
            due = (len(metrics) >= BATCH_ROWS or stop or flushes or events
                   or time.monotonic() - last_write >= BATCH_SECONDS)
            if not due:
                continue
            if metrics or events:
                store = self._write(store, metrics, events)
                metrics, events = [], []
            last_write = time.monotonic()
            for marker in flushes:
                marker.done.set()
            flushes = []
        if store is not None:
            store.close()

    def _write(self, store: RunStore | None, metrics: list[MetricRow],
               events: list[EventRow]) -> RunStore | None:
        """Write one batch; returns the store to reuse (None to reopen next time)."""
        try:
            if store is None:
                store = RunStore(self.store_path)
            self.written += store.log_metrics(self.run_id, metrics)
            self.written += store.log_events(self.run_id, events)
            return store
        except Exception:  # a metrics failure must never reach the training loop
            log.exception("run store: writing %d metric(s) and %d event(s) to %s failed; "
                          "they are dropped", len(metrics), len(events), self.store_path)
            self.dropped += len(metrics) + len(events)
            if store is not None:
                try:
                    store.close()
                except Exception:  # the connection may already be unusable
                    log.debug("run store: closing after a failure failed", exc_info=True)
            return None
