"""What LARS and LAMB share: argument checks and a per-parameter step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer


def check_range(name: str, value: float, low: float, high: float | None = None) -> None:
    """Raise ValueError unless low <= value (< high)."""
    if value < low or (high is not None and value >= high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"{name}: {value!r} is out of range; expected a number {allowed}")


class LayerwiseOptimizer(Optimizer):
    """An optimizer that updates each parameter on its own (`_update`)."""

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient; returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss
