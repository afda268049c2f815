"""Control experiments: their arms, the confirmed / refuted / inconclusive rule, the API."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tandem.analyze.diagnosis.diagnose import IN_MEMORY_DATA, NO_COMM, Finding
from tandem.tune import controls
from tandem.tune.arms import Bench
from tandem.tune.space import DATA_CONTROL
from tandem.tune.stats import Interval
from tandem.tune.trial import RunOutcome, TrialRunner


def _finding(kind: str, predicted: float | None, control: str | None = None,
             **evidence: Any) -> Finding:
    return Finding(kind, "high", evidence, f"{kind} -> advice", [],
                   predicted_speedup=predicted, control=control)


def test_classify_follows_the_documented_rule() -> None:
    floor = 1.1
    assert controls.classify(2.0, Interval(1.9, 1.7, 2.1, 3), floor)[0] == "confirmed"
    # within 15% of the interval: 2.3 <= 2.1 x 1.15
    assert controls.classify(2.3, Interval(1.9, 1.7, 2.1, 3), floor)[0] == "confirmed"
    state, reason = controls.classify(3.0, Interval(1.9, 1.7, 2.1, 3), floor)
    assert state == "inconclusive" and "less than the predicted" in reason
    # upper bound 1.2 < 1 + (2 - 1) / 2: refuted
    assert controls.classify(2.0, Interval(1.05, 0.9, 1.2, 3), floor)[0] == "refuted"
    assert controls.classify(2.0, Interval(1.3, 1.05, 1.6, 2), floor)[0] == "inconclusive"
    assert controls.classify(None, Interval(1.9, 1.7, 2.1, 3), floor)[0] == "confirmed"
    assert controls.classify(None, Interval(1.0, 0.95, 1.04, 3), floor)[0] == "refuted"


def test_predicted_speedup_from_the_field_else_from_the_evidence() -> None:
    assert controls.predicted_of(_finding("input-bound", 1.8)) == 1.8
    f = _finding("input-bound", None, step_s=0.04, phase_s=0.03)
    assert controls.predicted_of(f) == pytest.approx(4.0)
    assert controls.predicted_of(_finding("straggler", None)) is None


def test_control_arms() -> None:
    job = {"checkpoint.every": 7, "fault.nonfinite": "rollback", "plan.tp": 1}
    changes, launcher = controls.control_arm(NO_COMM, job, {"data.workers": 2})
    assert changes["plan.strategy"] == "localsgd" and changes["plan.comm_hook"] == "none"
    assert changes["plan.sync_every"] % 7 == 0 and changes["plan.sync_every"] >= 1e6
    assert changes["monitor.calibrate_at"] == 0 and changes["fault.nonfinite"] == "skip"
    assert changes["data.workers"] == 2 and launcher == ""
    assert controls.control_arm(IN_MEMORY_DATA, job, {}) == ({}, DATA_CONTROL)
    assert controls.control_arm(NO_COMM, {**job, "plan.tp": 2}, {}) is None


class _Machine:
    """The data control removes 30 of 40 ms per step; 5% run-to-run noise."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.launched: list[tuple[str, str]] = []

    def launch(self, tag: str, changes: Mapping[str, Any], control: str) -> RunOutcome:
        self.launched.append((tag, control))
        rate = (1 / 0.010 if control == DATA_CONTROL else 1 / 0.040)
        rate *= math.exp(self.rng.gauss(0, 0.05))
        return RunOutcome(f"r{len(self.launched)}", ok=True, run_id=f"r{len(self.launched)}",
                          summary={"wall": rate, "step": rate})


def test_validate_confirms_a_true_prediction_and_refutes_a_false_one(tmp_path: Path) -> None:
    runner = TrialRunner("unused.py", [], 2, tmp_path, tmp_path / "t.db")
    for predicted, state in ((4.0, "confirmed"), (20.0, "refuted"), (1.02, "inconclusive")):
        machine = _Machine(1)
        bench = Bench(machine.launch, figure_of=lambda run: run.summary)
        out = controls.validate(runner, _finding("input-bound", predicted, IN_MEMORY_DATA),
                                pairs=3, job={}, bench=bench)
        assert out["state"] == state, out
        assert out["control"] == IN_MEMORY_DATA and out["predicted"] == predicted
        assert out["interval"][0] <= out["measured"] <= out["interval"][1]
        assert out["noise"]["placebo_pairs"] == controls.PLACEBO_PAIRS
        assert out["runs"] == 2 * out["pairs"] and out["pairs"] >= controls.MIN_PAIRS
        # the placebo ran first, then the control arm, with the shim
        assert machine.launched[0] == ("ref", "") and ("control", DATA_CONTROL) in machine.launched
    # a control that gains nothing refutes a predicted 2x
    flat = Bench(lambda t, c, k: RunOutcome("r", ok=True, summary={"step": 100.0 * (
        1 + 0.01 * random.random())}), figure_of=lambda run: run.summary)
    out = controls.validate(runner, _finding("input-bound", 2.0, IN_MEMORY_DATA), job={},
                            bench=flat)
    assert out["state"] == "refuted" and out["interval"][1] < 1.5


def test_no_control_for_a_finding_without_one(tmp_path: Path) -> None:
    runner = TrialRunner("unused.py", [], 2, tmp_path, tmp_path / "t.db")
    out = controls.validate(runner, _finding("straggler", 1.3), job={},
                            bench=Bench(lambda *a: pytest.fail("nothing may run")))
    assert out["state"] == "inconclusive" and out["runs"] == 0
