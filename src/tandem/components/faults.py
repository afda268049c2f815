"""Fault injection (`TANDEM_FAULTS`) as a run component: the planned faults act out at
the phase and step they name, and a planned NaN or loss spike scales that step's loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tandem.components.base import Component
from tandem.faults import FaultPlan

# Phases of the loop faults act in through `at`; the checkpoint's own two through
# `after_checkpoint` (the loop's 'checkpoint' phase is before a save is asked for).
LOOP_PHASES = frozenset({"step", "data", "compute", "optim", "eval"})


class FaultInjection(Component):
    """Acts out a FaultPlan: in the loop's phases, on the loss, around checkpoints."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.factor: float | None = None  # what this step's losses are multiplied by

    @classmethod
    def planned(cls, rank: int, attempt: int) -> FaultInjection | None:
        """The faults TANDEM_FAULTS plans for this rank and attempt, or None (the usual case)."""
        plan = FaultPlan.from_env(rank, attempt)
        return None if plan is None else cls(plan)

    def before_step(self, step: int) -> None:
        """Look up this step's loss fault once: it applies to every micro-batch."""
        self.factor = self.plan.loss_factor(step)

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        """An injected NaN or loss spike."""
        return loss if self.factor is None else loss * self.factor

    def at(self, phase: str, step: int) -> None:
        """Faults planned for this phase of this step."""
        if phase in LOOP_PHASES:
            self.plan.hit(phase, step)

    def after_checkpoint(self, moment: str, step: int, path: Path) -> None:
        """'checkpoint_write' before a commit, 'checkpoint' after one."""
        self.plan.hit("checkpoint_write" if moment == "written" else "checkpoint", step, path)
