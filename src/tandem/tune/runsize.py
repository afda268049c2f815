"""Trial runs sized in seconds, not steps: a slow plan costs the session what a fast one does.

A fixed number of steps makes a job that is 20 times slower per step spend 20 times the
budget on each run of its baseline and placebo, and leaves nothing for candidates. So:

* **The probe.** The baseline is launched for PROBE_STEPS steps (more than it will
  run) and stopped once its logging windows, after the first (warm-up), span half the
  run length and at least PROBE_WINDOWS windows, or three windows spanning a whole run
  (`probe_done`: a 2.5-s step in windows of 5 steps); its seconds per step
  (`wall_per_step`, logging and evaluation pauses included) size every later run.
* **Every later run** of a plan gets `size(seconds_per_step, run_s)`: enough steps to
  fill run_s seconds, at least MIN_STEPS (a first window of warm-up and three measured
  ones: a floor of 12 made a 2.5-s step's runs three times run_s), in WINDOWS
  logging windows. The seconds per step are the plan's own when it has been the
  session's current plan (`Pace`: the original plan's placebo runs after an adoption
  keep the original's pace; a 10x faster adoption would make them 10 times too long),
  else the current plan's; each of its runs updates it (`Pace.follow`: the machine's
  load changes during a session). A candidate whose prediction says it is faster gets its
  predicted share more steps (at most MAX_STRETCH times), so that its run also lasts
  about run_s and measures it over enough windows (more windows of the unstretched
  run's size, so that its losses are logged at its reference's steps).
* **Timeouts.** A run's timeout is capped by the session's budget left, never below
  `min_timeout` (`TrialRunner.limit`).
* **run_s** is the user's `--run-seconds`, else `auto_run_seconds(budget)`: a
  RUNS_PER_BUDGET-th of the budget, within [MIN_RUN_S, MAX_RUN_S].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.tune.stats import WindowFigure

PROBE_STEPS = 100_000  # the probe is stopped long before
PROBE_WINDOWS = 4
MIN_STEPS = 4
WINDOWS = 6
MAX_STRETCH = 4.0
RUNS_PER_BUDGET = 30
MIN_RUN_S = 4.0
MAX_RUN_S = 30.0
MIN_TIMEOUT_S = 45.0  # a cold start of 2 processes under load, and a run's windows


MAX_LAST_PAIRS = 8  # pairs the queue's last candidate may get at most


def last_pairs(left_s: float, run_s: float, max_pairs: int) -> int:
    """The looks of the queue's last candidate, fixed before its first: the pairs the
    budget left affords (two runs each), within [max_pairs, MAX_LAST_PAIRS]. No other
    candidate waits for that budget, and a small gain under load needs more pairs than
    --max-pairs (a 1.28x checkpointing fix stayed undecided after 4 pairs at load 10-19
    with 115 s of a 300-s budget unused). The sequential test's error rate holds for any
    number of looks fixed in advance (`stats.look_confidence`)."""
    affordable = int(left_s // (2 * run_s)) if run_s > 0 else 0
    return max(max_pairs, min(MAX_LAST_PAIRS, affordable))


def min_timeout(run_s: float) -> float:
    """The least a trial run's timeout is capped to by the budget left: a cold start
    (MIN_TIMEOUT_S covers one) and three times the run's seconds, so a run that starts
    with little budget left can still finish (the session ends at most that late)."""
    return max(MIN_TIMEOUT_S, 3 * run_s)


@dataclass(frozen=True)
class RunSize:
    """Steps of a trial run and its logging window."""

    steps: int
    log_every: int


def auto_run_seconds(budget_s: float) -> float:
    """Seconds of training per run for a session of `budget_s` seconds."""
    return min(MAX_RUN_S, max(MIN_RUN_S, budget_s / RUNS_PER_BUDGET))


def wall_per_step(windows: Sequence[WindowFigure]) -> float | None:
    """Wall seconds per step after the first window (None: fewer than two windows)."""
    if len(windows) < 2 or windows[-1].step <= windows[0].step:
        return None
    span = windows[-1].time - windows[0].time
    return span / (windows[-1].step - windows[0].step) if span > 0 else None


def probe_done(windows: Sequence[WindowFigure], run_s: float) -> bool:
    """Whether a probe has enough windows (and seconds of them) to be stopped: PROBE_WINDOWS
    spanning half a run, or (slow steps: long windows) three spanning a whole run."""
    span = windows[-1].time - windows[0].time if windows else 0.0
    if len(windows) >= PROBE_WINDOWS:
        return span >= run_s / 2
    return len(windows) >= 3 and span >= run_s


def size(seconds_per_step: float, run_s: float, stretch: float = 1.0) -> RunSize:
    """The steps and logging window of a run lasting about run_s x min(stretch,
    MAX_STRETCH) / stretch seconds: `stretch`, a predicted speed-up, lengthens it in steps."""
    if not (seconds_per_step > 0 and math.isfinite(seconds_per_step)):
        raise ValueError(f"seconds_per_step {seconds_per_step!r} must be a positive number")
    if run_s <= 0:
        raise ValueError(f"run_s {run_s!r} must be positive")
    factor = min(max(stretch, 1.0), MAX_STRETCH)
    steps = max(MIN_STEPS, math.ceil(run_s / seconds_per_step))
    log_every = max(1, steps // WINDOWS)
    windows = math.ceil(steps / log_every)
    # Stretched in windows of the unstretched run's size: its losses are then logged at
    # every step its reference's are (the convergence guardrail compares those steps).
    return RunSize(log_every * math.ceil(factor * windows), log_every)


@dataclass
class Pace:
    """Seconds per step of each plan that has been a session's current plan, by key."""

    of: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)
    latest: float | None = None

    def note(self, plan: tuple[tuple[str, str], ...], windows: Sequence[WindowFigure]
             ) -> None:
        """Record the pace of a run of the current plan `plan` (kept when it has none)."""
        seconds = wall_per_step(windows)
        if seconds:
            self.of[plan] = self.latest = seconds

    def follow(self, plan: tuple[tuple[str, str], ...], windows: Sequence[WindowFigure]
               ) -> None:
        """Update a known plan's pace from another of its runs: the machine may have
        slowed since (a neighbour's load). Sized from the probe's pace alone, runs at
        load 12-16 with a core kept busy lasted 3-6 times run_s and starved the session."""
        if plan in self.of:
            self.note(plan, windows)

    def size(self, plan: tuple[tuple[str, str], ...], current: tuple[tuple[str, str], ...],
             run_s: float, stretch: float = 1.0) -> RunSize | None:
        """A run of `plan`: at its own pace, unstretched; else at the current plan's (or
        the latest one measured), stretched by `stretch`; None before any pace."""
        if plan in self.of:
            return size(self.of[plan], run_s)
        base = self.of.get(current, self.latest)
        return size(base, run_s, stretch) if base else None
