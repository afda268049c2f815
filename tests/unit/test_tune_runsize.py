"""Trial runs sized in seconds: the probe's stop rule and the steps of later runs."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import pytest

from tandem.tune import runsize
from tandem.tune.stats import WindowFigure
from tandem.tune.trial import TrialRunner


def _windows(seconds_per_step: float, steps_per_window: int, n: int) -> list[WindowFigure]:
    return [WindowFigure((i + 1) * steps_per_window, 32.0 * steps_per_window,
                         seconds_per_step * steps_per_window,
                         100.0 + (i + 1) * steps_per_window * seconds_per_step)
            for i in range(n)]


def test_a_slow_and_a_fast_plan_get_runs_of_the_same_length() -> None:
    slow, fast = runsize.size(1.0, 10.0), runsize.size(0.01, 10.0)
    assert slow.steps * 1.0 == pytest.approx(max(10.0, runsize.MIN_STEPS), abs=slow.log_every)
    assert fast.steps * 0.01 == pytest.approx(10.0, abs=fast.log_every * 0.01)
    for sized in (slow, fast):
        assert sized.steps % sized.log_every == 0
        assert sized.steps // sized.log_every >= min(runsize.WINDOWS, sized.steps)


def test_a_predicted_speed_up_stretches_a_run_in_steps_within_a_cap() -> None:
    base = runsize.size(0.1, 10.0).steps
    assert runsize.size(0.1, 10.0, stretch=2.0).steps == pytest.approx(2 * base, rel=0.1)
    capped = runsize.size(0.1, 10.0, stretch=50.0).steps
    assert capped == pytest.approx(runsize.MAX_STRETCH * base, rel=0.1)
    assert runsize.size(0.1, 10.0, stretch=0.5).steps == base  # never shortened


def test_a_stretched_run_logs_at_every_step_its_reference_logs() -> None:
    # the convergence guardrail compares the losses of a pair's runs at common steps
    ref = runsize.size(0.05, 6.0)
    for stretch in (1.7, 3.0, 6.9):
        sized = runsize.size(0.05, 6.0, stretch=stretch)
        ref_steps = set(range(ref.log_every, ref.steps + 1, ref.log_every))
        assert ref_steps <= set(range(sized.log_every, sized.steps + 1, sized.log_every))


def test_the_probe_stops_on_time_and_windows() -> None:
    assert not runsize.probe_done(_windows(0.1, 5, 3), 2.0)  # too few windows
    assert not runsize.probe_done(_windows(2.5, 5, 2), 10.0)  # two: no span measured yet
    assert runsize.probe_done(_windows(2.5, 5, 3), 10.0)  # slow: 2 x 12.5 s >= a run
    assert not runsize.probe_done(_windows(0.01, 5, 6), 10.0)  # too short a span
    assert runsize.probe_done(_windows(0.5, 5, 4), 10.0)  # 3 x 2.5 s >= 5 s
    assert runsize.wall_per_step(_windows(0.25, 4, 5)) == pytest.approx(0.25)
    assert runsize.wall_per_step(_windows(0.25, 4, 1)) is None


def test_the_run_length_follows_the_budget_within_bounds() -> None:
    assert runsize.auto_run_seconds(300) == pytest.approx(300 / runsize.RUNS_PER_BUDGET)
    assert runsize.auto_run_seconds(10) == runsize.MIN_RUN_S
    assert runsize.auto_run_seconds(36000) == runsize.MAX_RUN_S


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_bad_step_time_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="seconds_per_step"):
        runsize.size(bad, 10.0)


def test_a_very_slow_step_still_gets_a_run_of_about_run_seconds() -> None:
    # 2.5 s a step (a job oversubscribing the cores under load): ceil(10 / 2.5) = 4
    # steps, one window each (the first is warm-up), not a floor three times longer
    sized = runsize.size(2.5, 10.0)
    assert (sized.steps, sized.log_every) == (4, 1)
    assert runsize.size(20.0, 10.0).steps == runsize.MIN_STEPS == 4


def test_a_runs_timeout_is_capped_by_the_budget_left_never_below_a_runs_worth(
        tmp_path: Path) -> None:
    runner = TrialRunner("job.py", [], 1, tmp_path, tmp_path / "runs.db", timeout_s=300.0)
    assert runner.limit(100.0) == (300.0, False)  # no session deadline: the flag's
    runner.deadline, runner.min_timeout_s = 1000.0, runsize.min_timeout(10.0)
    assert runsize.min_timeout(10.0) == runsize.MIN_TIMEOUT_S
    assert runsize.min_timeout(30.0) == 90.0  # three runs' worth of a long run
    assert runner.limit(100.0) == (300.0, False)  # plenty left: the flag's timeout
    assert runner.limit(800.0) == (200.0, True)  # 200 s left
    assert runner.limit(990.0) == (runsize.MIN_TIMEOUT_S, True)  # never below the floor
    assert runner.limit(2000.0) == (runsize.MIN_TIMEOUT_S, True)  # past the deadline
    # a real process is killed at the capped timeout, and the error says why
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    started = time.monotonic()
    code, error, stopped = runner._wait(proc, started, None, 0.5, True)
    assert proc.poll() is not None and code is None and not stopped
    assert time.monotonic() - started < 30.0
    assert error.startswith("timed out after 0 s") and "capped" in error, error


def test_the_last_candidate_gets_the_pairs_the_budget_left_affords_within_bounds() -> None:
    assert runsize.last_pairs(200.0, 10.0, 4) == runsize.MAX_LAST_PAIRS  # 10 affordable
    assert runsize.last_pairs(130.0, 10.0, 4) == 6  # 130 s: six pairs of 2 x 10 s
    assert runsize.last_pairs(30.0, 10.0, 4) == 4  # never fewer than --max-pairs
    assert runsize.last_pairs(30.0, 0.0, 4) == 4
