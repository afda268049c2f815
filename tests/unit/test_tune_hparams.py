"""The hyper-parameter mode's search space, objective and confirmation (no processes)."""

from __future__ import annotations

import math

import pytest

from tandem.config import load
from tandem.tune import hparams
from tandem.tune.trial import RunOutcome

optuna = pytest.importorskip("optuna")


def test_space_maps_a_trial_to_valid_config_changes() -> None:
    trial = optuna.trial.FixedTrial({"lr_multiplier": 2.0, "schedule": "warmup_cosine",
                                     "warmup_steps": 6, "batch_factor": 2.0})
    changes = hparams.space(trial, global_batch=32, steps=60, world=2)
    assert changes["train.global_batch"] == 64
    # lr x 2 at the doubled batch: linear scaling against a reference of 64 / 2
    assert changes["optim.lr_scaling"] == "linear"
    assert changes["train.global_batch"] / changes["optim.reference_batch"] == 2.0
    assert changes["optim.warmup_steps"] == 6
    load(overrides=changes)  # a valid config


def test_objective_penalises_a_missed_target() -> None:
    assert hparams.objective_of({"time_to_target_s": 3.5, "wall_time_s": 9.0}) == (3.5, True)
    value, hit = hparams.objective_of({"wall_time_s": 9.0, "target": "x not reached"})
    assert not hit and value == hparams.PENALTY * 9.0 > 9.0



class _Runner:
    """Runs whose time to target is 10 s (current settings) or `best_s`, x 5% noise."""

    def __init__(self, best_s: float, seed: int) -> None:
        import random

        self.rng, self.best_s, self.runs = random.Random(seed), best_s, 0

    def run(self, name: str, changes: dict, steps: int, log_every: int,
            eval_every: int | None = None) -> RunOutcome:
        self.runs += 1
        seconds = (self.best_s if changes else 10.0) * math.exp(self.rng.gauss(0, 0.05))
        return RunOutcome(name, ok=True, run_id=name,
                          summary={"time_to_target_s": seconds, "wall_time_s": 20.0})


@pytest.mark.parametrize(("best_s", "adopt"), [(5.0, True), (10.0, False)])
def test_the_best_trial_is_confirmed_in_paired_runs_with_a_placebo(best_s: float,
                                                                     adopt: bool) -> None:
    runner = _Runner(best_s, 3)
    base = runner.run("base", {}, 10, 5)
    ok, record = hparams.confirm(runner, "s", base, {"optim.schedule": "onecycle"}, 10, 5,
                                 2, 0.05, 4, lambda runs: True)
    assert ok is adopt, record
    assert record["figure"] == "target" and len(record["placebo_runs"]) == 2
    assert record["noise"]["placebo_pairs"] == 2
    if adopt:  # 10 s / 5 s: the interval holds the true speed-up
        assert record["ratio"]["low"] <= 2.0 <= record["ratio"]["high"]
    # the placebo's first pair reused the baseline run: 1 + 3 placebo + 2 per pair
    assert runner.runs == 1 + 3 + 2 * record["pairs"]
