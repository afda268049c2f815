"""The link is measured again on a sustained change of the step time, not on one window."""

from __future__ import annotations

import random

from tandem.trainer.calibration import DRIFT_WINDOWS, DriftWatch


def test_single_slow_windows_are_not_a_drift() -> None:
    """A busy machine: windows of 25 ms with one in four at 2-3x (a neighbour's burst).
    Judged window by window this was a 'drift' every few windows."""
    rng = random.Random(0)
    watch = DriftWatch()
    fired = [watch.update(0.025 * (rng.uniform(2, 3) if i % 4 == 3 else rng.uniform(0.95, 1.05)))
             for i in range(400)]
    assert not any(fired)


def test_a_sustained_change_is_a_drift_once_the_recent_median_moves() -> None:
    watch = DriftWatch()
    steps = [0.025] * 10 + [0.040] * 10
    fired = [watch.update(s) for s in steps]
    # the median of the last DRIFT_WINDOWS moves once most of them are slow
    first = fired.index(True)
    assert first == 10 + DRIFT_WINDOWS // 2
    assert not any(fired[:first])
    watch.reset()  # measured again: the next windows are the new reference
    assert not any(watch.update(0.040) for _ in range(20))
    assert watch.reference == 0.040
