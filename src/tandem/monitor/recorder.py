"""Rank 0's record of a run in the run store: config, environment, metrics, events, outcome."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tandem.monitor.live import Window
from tandem.monitor.store import RunStore, environment
from tandem.monitor.writer import StoreWriter
from tandem.status import RunStatus

log = logging.getLogger("tandem")


def new_run_id(name: str) -> str:
    """A unique run id that sorts by start time: <name>-<UTC date>-<time>-<4 hex>."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.urandom(2).hex()}"


class Recorder:
    """Writes one run into the store through a background writer (rank 0 only)."""

    def __init__(self, store_path: Path, run_id: str, name: str, config: dict[str, Any],
                 plan: dict[str, Any], device: str, world_size: int) -> None:
        self.store_path, self.run_id = store_path, run_id
        store_path.parent.mkdir(parents=True, exist_ok=True)
        with RunStore(store_path) as store:
            store.start_run(run_id, name, config, plan, environment(device, world_size))
        self.writer = StoreWriter(store_path, run_id)

    def window(self, window: Window) -> None:
        """Every row and event of a logging window."""
        now = time.time()
        for step, rank, name, value in window.rows:
            self.writer.metric(step, rank, name, value, now)
        for event in window.events:
            self.event(event.step, event.kind, event.message, event.value, event.threshold)

    def values(self, step: int, values: dict[str, float]) -> None:
        """Job-wide values measured once (evaluation, calibration)."""
        now = time.time()
        for name, value in values.items():
            self.writer.metric(step, -1, name, value, now)

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None:
        """Something that happened, with the figures that made it happen."""
        self.writer.event(step, rank, kind, message, value, threshold)

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        """Drain the writer, then mark the run finished with its summary."""
        self.writer.close()
        try:
            with RunStore(self.store_path) as store:
                store.finish_run(self.run_id, status, summary)
        except Exception as err:  # the record must never hide the run's own outcome
            log.warning("run store: could not record the end of run %s: %s", self.run_id, err)


def record_failure(store_path: Path, name: str, config: dict[str, Any], world_size: int,
                   kind: str, message: str) -> None:
    """A run that stopped before its first step (a preflight or usage error), recorded as
    a failed run with one event saying why; never raises."""
    run_id = new_run_id(name)
    try:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        with RunStore(store_path) as store:
            store.start_run(run_id, name, config, {}, environment(None, world_size))
            store.log_event(run_id, 0, -1, kind, message)
            store.finish_run(run_id, RunStatus.FAILED, {"error": message})
    except Exception as err:  # the record must never hide the message itself
        log.warning("run store: could not record the failed start of %s: %s", name, err)
