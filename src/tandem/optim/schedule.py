"""Learning-rate schedules as pure functions of the step, and batch-size scaling rules."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tandem.config import OptimConfig


def lr_multiplier(cfg: OptimConfig, step: int, total_steps: int) -> float:
    """The factor applied to each param group's base lr before optimizer step `step`.

    A pure function of the step: a resumed run needs no scheduler state.
    """
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "warmup_cosine":
        return _warmup_cosine(step, total_steps, cfg.warmup_steps, cfg.min_lr_ratio)
    if cfg.schedule == "warmup_linear":
        return _warmup_linear(step, total_steps, cfg.warmup_steps, cfg.min_lr_ratio)
    if cfg.schedule == "wsd":
        return _wsd(step, total_steps, cfg.warmup_steps, cfg.cooldown_frac, cfg.min_lr_ratio)
    return _onecycle(step, total_steps, cfg.pct_start, cfg.min_lr_ratio)


def _warmup_cosine(step: int, total: int, warmup: int, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _warmup_linear(step: int, total: int, warmup: int, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 1.0 - (1.0 - floor) * progress


def _wsd(step: int, total: int, warmup: int, cooldown: float, floor: float) -> float:
    # Warm-up, stable, decay: the peak until the last `cooldown` of the steps, then a
    # straight line to `floor` at the end (modded-nanogpt's and MiniCPM's shape).
    if step < warmup:
        return (step + 1) / warmup
    start = max(warmup, total - round(cooldown * total))
    if step < start:
        return 1.0
    progress = min(1.0, (step - start) / max(1, total - start))
    return 1.0 - (1.0 - floor) * progress


def _anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _onecycle_phase(step: int, total: int, pct_start: float) -> tuple[bool, float]:
    """(rising, fraction of the phase done) of torch's two-phase OneCycleLR at `step`."""
    peak_step = max(1.0, pct_start * total - 1)
    if step <= peak_step:
        return True, step / peak_step
    return False, min(1.0, (step - peak_step) / max(1.0, total - 1 - peak_step))


def _onecycle(step: int, total: int, pct_start: float, floor: float) -> float:
    # torch's OneCycleLR (two phases, cosine annealing, div_factor 25) as a pure function.
    rising, pct = _onecycle_phase(step, total, pct_start)
    return _anneal(0.04, 1.0, pct) if rising else _anneal(1.0, floor, pct)


def momentum_at(cfg: OptimConfig, step: int, total_steps: int) -> float | None:
    """The momentum for optimizer step `step` (None: leave the optimizer's own).

    onecycle is torch OneCycleLR's cycle_momentum: momentum_max down to momentum_min
    while the lr rises (the first pct_start of the steps), back up while it falls.
    """
    if cfg.momentum_schedule == "constant":
        return None
    rising, pct = _onecycle_phase(step, total_steps, cfg.pct_start)
    lo, hi = cfg.momentum_min, cfg.momentum_max
    return _anneal(hi, lo, pct) if rising else _anneal(lo, hi, pct)


def batch_scale(cfg: OptimConfig, global_batch: int) -> float:
    """The lr factor that the scaling rule gives for `global_batch`."""
    if cfg.lr_scaling == "none":
        return 1.0
    ratio = global_batch / cfg.reference_batch
    return ratio if cfg.lr_scaling == "linear" else math.sqrt(ratio)


class LrController:
    """Sets every param group's lr to base_lr x scale(batch) x schedule(step), and its
    momentum (SGD's `momentum`, Adam's beta1) when the config schedules it."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int,
                 global_batch: int, batch_at: Callable[[int], int] | None = None) -> None:
        self.optimizer = optimizer
        self.cfg = cfg
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.batch_at = batch_at  # a batch-size ramp: the lr follows the scaling rule
        self.base = [float(group["lr"]) for group in optimizer.param_groups]
        self.extra = 1.0  # lowered by rollbacks (fault.rollback_lr_scale)
        if cfg.momentum_schedule != "constant":
            for group in optimizer.param_groups:
                if "betas" not in group and not group.get("momentum"):
                    raise ValueError(
                        f"optim.momentum_schedule {cfg.momentum_schedule!r}: the optimizer "
                        f"({type(optimizer).__name__}) has no momentum to schedule (SGD "
                        "needs momentum > 0; Adam-style optimizers use beta1)")

    def apply(self, step: int) -> float:
        """Set the lrs (and momenta) for optimizer step `step`; return the first group's lr."""
        batch = self.global_batch if self.batch_at is None else self.batch_at(step)
        factor = (batch_scale(self.cfg, batch) * self.extra
                  * lr_multiplier(self.cfg, step, self.total_steps))
        momentum = momentum_at(self.cfg, step, self.total_steps)
        for group, base in zip(self.optimizer.param_groups, self.base, strict=True):
            group["lr"] = base * factor
            if momentum is not None:
                if "betas" in group:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return self.base[0] * factor
