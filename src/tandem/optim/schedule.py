"""Learning-rate schedules as pure functions of the step, and batch-size scaling rules."""

from __future__ import annotations

import math

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
    return _onecycle(step, total_steps, cfg.pct_start, cfg.min_lr_ratio)


def _warmup_cosine(step: int, total: int, warmup: int, floor: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _onecycle(step: int, total: int, pct_start: float, floor: float) -> float:
    # torch's OneCycleLR (two phases, cosine annealing, div_factor 25) as a pure function.
    def anneal(start: float, end: float, pct: float) -> float:
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)

    peak_step = max(1.0, pct_start * total - 1)
    if step <= peak_step:
        return anneal(0.04, 1.0, step / peak_step)
    pct = min(1.0, (step - peak_step) / max(1.0, total - 1 - peak_step))
    return anneal(1.0, floor, pct)


def batch_scale(cfg: OptimConfig, global_batch: int) -> float:
    """The lr factor that the scaling rule gives for `global_batch`."""
    if cfg.lr_scaling == "none":
        return 1.0
    ratio = global_batch / cfg.reference_batch
    return ratio if cfg.lr_scaling == "linear" else math.sqrt(ratio)


class LrController:
    """Sets every param group's lr to base_lr x scale x schedule(step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int,
                 global_batch: int) -> None:
        self.optimizer = optimizer
        self.cfg = cfg
        self.total_steps = total_steps
        self.scale = batch_scale(cfg, global_batch)
        self.base = [float(group["lr"]) for group in optimizer.param_groups]
        self.extra = 1.0  # lowered by rollbacks (fault.rollback_lr_scale)

    def apply(self, step: int) -> float:
        """Set the lrs for optimizer step `step`; return the first group's lr."""
        factor = self.scale * self.extra * lr_multiplier(self.cfg, step, self.total_steps)
        for group, base in zip(self.optimizer.param_groups, self.base, strict=True):
            group["lr"] = base * factor
        return self.base[0] * factor
