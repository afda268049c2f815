"""Fault injection: a declarative plan of what goes wrong, where and when.

The plan comes from the environment variable TANDEM_FAULTS, either JSON or the path of
a JSON file: a list of faults such as

    [{"rank": 1, "step": 7, "phase": "compute", "kind": "kill"},
     {"rank": 0, "step": 12, "kind": "nan"},
     {"rank": "*", "step": 20, "phase": "checkpoint", "kind": "corrupt"}]

kinds: kill (SIGKILL itself), sigterm, sigstop, raise (RuntimeError), nan (the step's
loss becomes NaN), spike (the step's loss is multiplied by `seconds`, default 1000),
slow (sleep `seconds`), corrupt (flip one byte of the checkpoint just
written). With "until": U a fault acts at every step from `step` to U - 1 (a worker
slowed for a stretch of the run: {"rank": 3, "step": 0, "until": 1000000, "kind": "slow",
"seconds": 0.05}); with "factor": F a slow fault sleeps F times as long as the step has
taken so far instead of `seconds` (phase optim, factor 1: the worker's steps take twice as
long whatever the host's speed). phases: step (start of a step, the default), data, compute, optim,
checkpoint_write (a save's shards are written, its commit not yet made: in the background
thread of an asynchronous save), checkpoint (a save committed), eval. A fault fires in
restart attempt `attempt` only (default 0), so a restarted group does not die again at
the same step, and once per process (a rolled-back run that passes the step again does
not meet it again). With TANDEM_FAULT_LOG set, each fault
appends a JSON line (time, rank, step, phase, kind) to that file before it acts, so a
benchmark can time detection and restart from the moment of the fault.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tandem")

KINDS = ("kill", "sigterm", "sigstop", "raise", "nan", "spike", "slow", "corrupt")
PHASES = ("step", "data", "compute", "optim", "checkpoint_write", "checkpoint", "eval")


@dataclass(frozen=True)
class Fault:
    """One thing to go wrong."""

    step: int
    kind: str
    rank: int | None = None  # None: every rank
    phase: str = "step"
    attempt: int = 0
    seconds: float = 1.0  # slow: how long; spike: the loss factor
    until: int | None = None  # acts at every step in [step, until)
    factor: float | None = None  # slow: sleep this many times the step's time so far

    def due_at(self, step: int) -> bool:
        """Whether the fault acts at `step`."""
        return self.step <= step < self.until if self.until is not None else step == self.step

    @classmethod
    def parse(cls, item: dict) -> Fault:
        """Validate one JSON entry."""
        kind, phase = item.get("kind"), item.get("phase", "step")
        if kind not in KINDS:
            raise ValueError(f"TANDEM_FAULTS: kind {kind!r} is not one of {list(KINDS)}")
        if phase not in PHASES:
            raise ValueError(f"TANDEM_FAULTS: phase {phase!r} is not one of {list(PHASES)}")
        rank = item.get("rank", "*")
        return cls(step=int(item["step"]), kind=kind, rank=None if rank == "*" else int(rank),
                   phase=phase, attempt=int(item.get("attempt", 0)),
                   seconds=float(item.get("seconds", 1000.0 if kind == "spike" else 1.0)),
                   until=int(item["until"]) if "until" in item else None,
                   factor=float(item["factor"]) if "factor" in item else None)


class FaultPlan:
    """The faults meant for this rank and restart attempt."""

    def __init__(self, faults: list[Fault], rank: int, attempt: int) -> None:
        self.rank = rank
        self.faults = [f for f in faults
                       if (f.rank is None or f.rank == rank) and f.attempt == attempt]
        self.fired: set[tuple[Fault, int]] = set()
        self.step_began = time.perf_counter()  # when the current step's 'step' phase came

    @classmethod
    def from_env(cls, rank: int, attempt: int) -> FaultPlan | None:
        """The plan in TANDEM_FAULTS, or None when there is none (the usual case)."""
        text = os.environ.get("TANDEM_FAULTS", "").strip()
        if not text:
            return None
        if not text.startswith("["):
            text = Path(text).read_text()
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"TANDEM_FAULTS is not valid JSON: {err}") from None
        return cls([Fault.parse(item) for item in items], rank, attempt)

    def loss_factor(self, step: int) -> float | None:
        """What this step's loss is to be multiplied by (NaN or a spike), if anything."""
        due = self._due("loss", step, lambda f: f.kind in ("nan", "spike"))
        if not due:
            return None
        return float("nan") if due[0].kind == "nan" else due[0].seconds

    def _due(self, phase: str, step: int, pick: Callable[[Fault], bool]) -> list[Fault]:
        due = [f for f in self.faults
               if f.due_at(step) and (f, step) not in self.fired and pick(f)]
        self.fired.update((f, step) for f in due)
        return due

    def hit(self, phase: str, step: int, checkpoint: Path | None = None) -> None:
        """Act out the faults planned for (phase, step)."""
        on_loss = ("nan", "spike")
        if phase == "step":
            self.step_began = time.perf_counter()
        for fault in self._due(phase, step, lambda f: f.phase == phase and f.kind not in on_loss):
            if step == fault.step:  # a fault over a stretch of steps speaks once
                log.warning("fault injection: %s at step %d (%s)", fault.kind, step, phase)
            _log(fault, self.rank)
            _act(fault, checkpoint, time.perf_counter() - self.step_began)


def _log(fault: Fault, rank: int) -> None:
    path = os.environ.get("TANDEM_FAULT_LOG")
    if path:
        record = {"time": time.time(), "rank": rank, "step": fault.step, "phase": fault.phase,
                  "kind": fault.kind}
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")


def _act(fault: Fault, checkpoint: Path | None, step_s: float) -> None:
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif fault.kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault.kind == "raise":
        raise RuntimeError(f"injected fault at step {fault.step} ({fault.phase})")
    elif fault.kind == "slow":
        time.sleep(fault.seconds if fault.factor is None else fault.factor * step_s)
    elif fault.kind == "corrupt" and checkpoint is not None:
        corrupt(checkpoint)


def corrupt(checkpoint: Path) -> Path:
    """Flip one byte in the middle of the checkpoint's largest data file."""
    files = [p for p in checkpoint.iterdir() if p.is_file() and p.name != "manifest.json"]
    target = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target
