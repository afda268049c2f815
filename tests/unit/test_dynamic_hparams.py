"""Momentum schedules against torch's OneCycleLR; the batch-size ramp's parsing and lr rule."""

from __future__ import annotations

import pytest
import torch

from tandem.config import Config, OptimConfig, load, parse_ramp
from tandem.optim.schedule import LrController, momentum_at


def test_onecycle_momentum_matches_torch() -> None:
    steps = 40
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=0.1, total_steps=steps, pct_start=0.3, base_momentum=0.8,
        max_momentum=0.95)
    cfg = OptimConfig(schedule="onecycle", pct_start=0.3, momentum_schedule="onecycle",
                      momentum_min=0.8, momentum_max=0.95)
    for step in range(steps):
        assert momentum_at(cfg, step, steps) == pytest.approx(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()


def test_controller_sets_adam_beta1_and_sgd_momentum() -> None:
    cfg = OptimConfig(momentum_schedule="onecycle", momentum_min=0.85, momentum_max=0.95)
    p = [torch.nn.Parameter(torch.zeros(2))]
    adam = torch.optim.AdamW(p, lr=1e-3, betas=(0.9, 0.999))
    LrController(adam, cfg, 100, 32).apply(0)
    assert adam.param_groups[0]["betas"] == (pytest.approx(0.95), 0.999)
    sgd = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    LrController(sgd, cfg, 100, 32).apply(29)  # the bottom of the cycle
    assert sgd.param_groups[0]["momentum"] == pytest.approx(0.85)
    with pytest.raises(ValueError, match="no momentum to schedule"):
        LrController(torch.optim.SGD(p, lr=0.1), cfg, 100, 32)


def test_ramp_lr_follows_the_scaling_rule() -> None:
    cfg = OptimConfig(lr_scaling="linear", reference_batch=64)
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(p, lr=0.4)
    ramp = dict([(0, 16), (10, 32), (20, 64)])

    def batch_at(step: int) -> int:
        return max(b for s, b in ramp.items() if s <= step) if step < 20 else 64

    lr = LrController(opt, cfg, 30, 64, batch_at)
    assert lr.apply(0) == pytest.approx(0.1) and lr.apply(15) == pytest.approx(0.2)
    assert lr.apply(25) == pytest.approx(0.4)


@pytest.mark.parametrize("text, error", [
    ("5:16,10:32", "step 0"),
    ("0:16,0:32", "steps must rise"),
    ("0:32,10:16,20:32", "must not shrink"),
    ("0:16,10:32", "must equal train.global_batch"),
    ("0-16", "not STEP:BATCH"),
])
def test_bad_ramps_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_ramp(text, 64)


def test_ramp_parses_and_refuses_rollback() -> None:
    assert parse_ramp("0:16, 10:32, 20:64", 64) == [(0, 16), (10, 32), (20, 64)]
    load(overrides={"train.batch_ramp": "0:64,5:128"})
    with pytest.raises(ValueError, match="rollback"):
        load(overrides={"train.batch_ramp": "0:64,5:128", "fault.nonfinite": "rollback"})
    assert Config().train.batch_ramp == ""
