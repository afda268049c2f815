"""The hyper-parameter mode's search space and objective (no runs)."""

from __future__ import annotations

import pytest

from tandem.config import load
from tandem.tune import hparams

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

