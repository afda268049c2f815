"""What a resume found, and the optimizer's record a later resume compares against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.trainer.progress import Reporter


@dataclass(frozen=True)
class Resumed:
    """The outcome of `Trainer.resume`."""

    path: Path | None  # the checkpoint loaded (None: a fresh start)
    skipped: list[str]  # newer checkpoints that did not verify, and why
    moved_aside: list[str]  # checkpoints a fresh start moved aside
    complete: bool  # the loaded state is already at train.steps
    warning: str = ""  # allowed changes of guarded settings

    def report(self, reporter: Reporter, restart_count: int) -> None:
        """Record and show what happened before this attempt's first step."""
        step = int(self.path.name.removeprefix("step_")) if self.path is not None else 0
        for problem in self.skipped:
            reporter.event(step, "checkpoint_skipped", f"skipped a bad checkpoint: {problem}")
        for path in self.moved_aside:
            reporter.event(step, "set_aside", f"run.resume fresh: moved {path} aside")
        if restart_count:
            reporter.event(step, "restart", f"the launcher restarted the process group "
                                            f"(restart {restart_count})")
        if self.path is not None:
            reporter.event(step, "resume", f"resumed from {self.path} at step {step}"
                           + (f" (newer checkpoints skipped: {len(self.skipped)})"
                              if self.skipped else ""))
        if self.warning:
            reporter.event(step, "config_change", self.warning)


def optimizer_record(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's type and settings, as JSON (what a resume compares)."""
    groups = []
    for group in optimizer.param_groups:
        groups.append({k: _plain(v) for k, v in group.items() if k != "params"})
    return {"type": type(optimizer).__name__, "param_groups": groups}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)
