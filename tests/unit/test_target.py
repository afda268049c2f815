"""train.target counts a float32 mean that equals the goal (470/500 >= 0.94)."""

from __future__ import annotations

import pytest
import torch

from tandem.config import parse_target
from tandem.config.values import target_met


def _reached(target: str, value: float) -> bool:
    return target_met(parse_target(target), {"accuracy": value, "loss": value}) is not None


def test_float32_mean_at_the_goal_counts() -> None:
    value = float(torch.tensor(470.0) / torch.tensor(500.0))  # float32: 0.93999999...
    assert value < 0.94
    assert _reached("accuracy>=0.94", value)
    assert not _reached("accuracy>=0.94", 469 / 500)
    assert _reached("loss<=1.2", 1.2 + 1e-7) and not _reached("loss<=1.2", 1.2001)


def test_unknown_metric_is_named() -> None:
    with pytest.raises(ValueError, match="'bleu'"):
        target_met(parse_target("bleu>=1"), {"accuracy": 1.0})
