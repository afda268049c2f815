"""Liveness records: where each rank is, so a hang names the rank that stopped.

A daemon thread writes this rank's (step, phase, time) into the process group's store
every few seconds; the training loop only assigns two attributes. When a collective
times out, `describe` reads every rank's last record: a rank whose record is old
stopped answering, and the message says where it was.
"""

from __future__ import annotations

import json
import threading
import time

import torch.distributed as dist


class Heartbeat:
    """Publishes where this rank is; reads where the others were."""

    def __init__(self, store: dist.Store | None, rank: int, world_size: int,
                 interval_s: float) -> None:
        self.store, self.rank, self.world = store, rank, world_size
        self.step, self.phase = 0, "start"
        self.interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if store is not None and interval_s > 0:
            self._publish()
            self._thread = threading.Thread(target=self._run, name="tandem-heartbeat",
                                            daemon=True)
            self._thread.start()

    def at(self, step: int, phase: str) -> None:
        """Note where the loop is (cheap: two assignments)."""
        self.step, self.phase = step, phase

    def _publish(self) -> None:
        record = {"step": self.step, "phase": self.phase, "time": time.time()}
        self.store.set(f"tandem/heartbeat/{self.rank}", json.dumps(record))  # type: ignore[union-attr]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._publish()
            except Exception:  # the store went away with the group: nothing to report to
                return

    def describe(self) -> str:
        """Every rank's last record, stalest first, as one line each."""
        if self.store is None:
            return "no liveness records (one process)"
        now, lines = time.time(), []
        for rank in range(self.world):
            key = f"tandem/heartbeat/{rank}"
            try:
                if not self.store.check([key]):
                    lines.append((float("inf"), f"rank {rank}: never reported"))
                    continue
                record = json.loads(self.store.get(key))
            except Exception as err:
                lines.append((float("inf"), f"rank {rank}: record unreadable ({err})"))
                continue
            age = now - record["time"]
            lines.append((age, f"rank {rank}: last seen {age:.1f} s ago at step "
                               f"{record['step']} ({record['phase']})"))
        lines.sort(key=lambda item: -item[0])
        return "; ".join(text for _, text in lines)

    def close(self) -> None:
        """Stop publishing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
