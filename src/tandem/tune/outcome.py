"""A tune session's settings, its decision record and its result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.analyze.diagnosis.diagnose import Finding
from tandem.tune import stats as tstats


@dataclass
class Settings:
    """How hard the tuner looks."""

    budget_s: float = 600.0
    max_trials: int = 10  # controls and candidates
    steps: int = 0  # steps of each trial run (0: sized in seconds, `runsize.py`)
    log_every: int = 5  # steps per logging window at most (the probe's, when sized)
    run_s: float = 0.0  # seconds of training per sized run (0: from the budget)
    min_gain: float = tstats.MIN_GAIN
    confidence: float = tstats.CONFIDENCE
    guard_steps: int = 0
    placebo_pairs: int = 3
    max_pairs: int = tstats.MAX_PAIRS
    control_pairs: int = 3
    task_targets: tuple[str, ...] = ()  # a mixture's, 'task/NAME/METRIC>=V' (`mixing.py`)


@dataclass
class Record:
    """One line of the decision record."""

    trial_id: str
    label: str
    kind: str  # baseline, placebo, control, candidate, confirm
    status: str  # measured, bound, skipped, stopped-early, not-significant, rejected,
    #              adopted, revoked (adopted, then undone by the final noise), failed, invalid,
    #              not-reached (the budget or --max-trials ran out before it)
    changes: dict[str, Any]
    figures: dict[str, Any]
    decision: str


@dataclass
class TuneResult:
    """What a tune session found."""

    session_id: str
    changes: dict[str, Any]  # the chosen plan over the original one ({} = keep it)
    records: list[Record]
    trials: int
    wall_s: float
    speedup: tstats.Interval | None
    findings: list[Finding]
    baseline: tstats.Interval | None  # the original plan's samples/s over its runs
    evidence: dict[str, str] = field(default_factory=dict)  # key -> why
    noise: dict[str, Any] | None = None  # the placebo and pooled noise at the end
    decision: str = ""  # the decision in words, where the session states one


def session_id(script: str) -> str:
    """'tune-train-20240601-120000'."""
    return f"tune-{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
