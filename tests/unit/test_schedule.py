import math

import pytest
import torch

from tandem.config import OptimConfig
from tandem.optim.schedule import LrController, batch_scale, lr_multiplier


def test_warmup_cosine_matches_its_formula() -> None:
    cfg = OptimConfig(schedule="warmup_cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(cfg, 0, 110) == pytest.approx(0.1)
    assert lr_multiplier(cfg, 9, 110) == pytest.approx(1.0)
    for step in (10, 35, 60, 109):
        progress = (step - 10) / 100
        want = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        assert lr_multiplier(cfg, step, 110) == pytest.approx(want)


def test_onecycle_follows_torch_onecycle_shape() -> None:
    total, peak = 100, 1.0
    cfg = OptimConfig(schedule="onecycle", pct_start=0.3, min_lr_ratio=0.0)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    ref = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=peak, total_steps=total, pct_start=0.3, anneal_strategy="cos",
        div_factor=25.0, final_div_factor=1e12, three_phase=False, cycle_momentum=False)
    for step in range(total):
        ours = lr_multiplier(cfg, step, total)
        assert ours == pytest.approx(opt.param_groups[0]["lr"], abs=1e-9), step
        opt.step()
        ref.step()


def test_scaling_rules() -> None:
    assert batch_scale(OptimConfig(lr_scaling="linear", reference_batch=64), 256) == 4.0
    assert batch_scale(OptimConfig(lr_scaling="sqrt", reference_batch=64), 256) == 2.0
    assert batch_scale(OptimConfig(), 256) == 1.0


def test_controller_sets_every_group_from_its_own_base() -> None:
    a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}])
    ctl = LrController(opt, OptimConfig(lr_scaling="linear", reference_batch=32), 10, 64)
    ctl.apply(3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.02])
