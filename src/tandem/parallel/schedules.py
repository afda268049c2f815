"""Pipeline schedules by name: which torch.distributed.pipelining class runs each, how
its stages sit on the ranks, what it needs, and a watchdog that names a stuck action."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("tandem")


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule: its class, the stages per rank it takes, how they are placed."""

    cls: str  # the class in torch.distributed.pipelining.schedules
    multi: bool  # takes several stages per rank (plan.pp_virtual)
    style: str = "loop"  # stage placement: "loop" (rank r: r, r+pp, ...) or "v"
    virtual: int = 0  # the stages per rank it requires (0: any, per `multi`)
    refused: str = ""  # why it cannot run here ("" : it runs)


SCHEDULES: dict[str, ScheduleInfo] = {
    "GPipe": ScheduleInfo("ScheduleGPipe", multi=False),
    "1F1B": ScheduleInfo("Schedule1F1B", multi=False),
    "Interleaved1F1B": ScheduleInfo("ScheduleInterleaved1F1B", multi=True),
    "LoopedBFS": ScheduleInfo("ScheduleLoopedBFS", multi=True),
    "InterleavedZeroBubble": ScheduleInfo("ScheduleInterleavedZeroBubble", multi=True),
    "ZBVZeroBubble": ScheduleInfo("ScheduleZBVZeroBubble", multi=True, style="v", virtual=2),
    "DualPipeV": ScheduleInfo("ScheduleDualPipeV", multi=True, style="v", virtual=2),
}


def check(name: str, pp: int, virtual: int, microbatches: int) -> None:
    """Raise ValueError when `name` cannot run `pp` ranks x `virtual` stages on
    `microbatches` micro-batches a step."""
    info = SCHEDULES[name]
    if info.refused:
        raise ValueError(f"plan.pp_schedule: {name!r} {info.refused}")
    if info.virtual and virtual != info.virtual:
        raise ValueError(f"plan.pp_virtual: {name!r} places exactly {info.virtual} stages "
                         f"on each process (a V shape); got {virtual}")
    if not info.multi and virtual != 1:
        multi = [n for n, s in SCHEDULES.items() if s.multi and not s.virtual]
        raise ValueError(f"plan.pp_virtual: {virtual} stages per process need a multi-stage "
                         f"schedule ({', '.join(multi)}); {name!r} runs one")
    stages = pp * virtual
    if name in ("1F1B", "DualPipeV", "ZBVZeroBubble") and microbatches < stages:
        raise ValueError(f"plan.pp_microbatches: {name!r} needs at least as many micro-batches "
                         f"a step as stages ({stages}); got {microbatches}")
    if info.multi and not info.virtual and name != "LoopedBFS" and microbatches % pp:
        raise ValueError(f"plan.pp_microbatches: {name!r} runs micro-batches in rounds of "
                         f"plan.pp ({pp}); {microbatches} is not a multiple of it")


def stage_indices(name: str, pp: int, virtual: int, pp_rank: int) -> list[int]:
    """The stages this rank runs, in order."""
    if SCHEDULES[name].style == "v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(virtual)]


def schedule_class(name: str) -> type:
    """The torch.distributed.pipelining class that runs schedule `name`."""
    from torch.distributed.pipelining import schedules

    return getattr(schedules, SCHEDULES[name].cls)


class Watchdog:
    """Stops a schedule step that makes no progress for `limit_s`, naming the schedule, the
    stage and the action it was in (or last finished).

    The main thread reports each action's start and end; a thread checks. A stuck rank
    may be blocked inside a collective, where nothing in Python runs: it logs the error
    and ends the process (exit status 3), which its launcher sees.
    """

    def __init__(self, schedule: str, limit_s: float) -> None:
        self.schedule, self.limit_s = schedule, limit_s
        self.where = "before its first action"
        self.since = time.monotonic()
        self.active = False
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def mark(self, where: str) -> None:
        """The main thread is now at `where`."""
        with self.lock:
            self.where, self.since = where, time.monotonic()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Watch the schedule's step inside."""
        if self.limit_s <= 0:
            yield
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="tandem-pp-watchdog",
                                           daemon=True)
            self.thread.start()
        self.mark("at the start of the step")
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def message(self) -> str:
        """What is stuck, for the error."""
        return (f"pipeline schedule {self.schedule!r} made no progress for "
                f"{self.limit_s:g} s (plan.pp_watchdog_s) on {self.where}")

    def _watch(self) -> None:
        while not self.stop.wait(min(1.0, self.limit_s / 4)):
            with self.lock:
                stuck = self.active and time.monotonic() - self.since > self.limit_s
            if stuck:
                log.error("%s; stopping this process", self.message())
                logging.shutdown()
                os._exit(3)


def timed(fn: Callable, watchdog: Watchdog, label: Callable[[int], str],
          add: Callable[[float], None]) -> Callable:
    """`fn(chunk, ...)` reporting its start and end to `watchdog` and its time to `add`."""
    def run(chunk: int, *args, **kwargs):  # type: ignore[no-untyped-def]
        watchdog.mark(label(chunk))
        start = time.perf_counter()
        out = fn(chunk, *args, **kwargs)
        add(time.perf_counter() - start)
        watchdog.mark(f"the wait after {label(chunk)} (receiving or sending)")
        return out
    return run


@contextmanager
def timed_waits(add: Callable[[float], None]) -> Iterator[None]:
    """Report to `add` the seconds each wait on the schedule's sends and receives takes,
    while the context lasts (PyTorch's schedules wait through one module function,
    `_wait_batch_p2p`; where it is gone, nothing is reported)."""
    from torch.distributed.pipelining import schedules as torch_schedules

    wait = getattr(torch_schedules, "_wait_batch_p2p", None)
    if wait is None:
        yield
        return

    def waited(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return wait(*args, **kwargs)
        finally:
            add(time.perf_counter() - start)

    torch_schedules._wait_batch_p2p = waited
    try:
        yield
    finally:
        torch_schedules._wait_batch_p2p = wait
