"""The trainer's own progress, checkpointed as JSON beside the tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.data.sampler import Cursor


@dataclass(kw_only=True)
class TrainState:
    """Everything besides model and optimizer tensors that a resume needs."""

    step: int = 0
    cursor: Cursor = field(default_factory=Cursor)
    samples: int = 0
    elapsed_s: float = 0.0  # wall time of the run over all attempts, at the last commit
    train_s: float = 0.0  # time in training steps only (no evaluation, no checkpoints)
    target_reached: dict[str, float] | None = None  # {"step", "elapsed_s", "value"}
    scaler: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1
    run_id: str = ""  # the run's id in the run store, kept across resumes
    rollbacks: int = 0
    lr_scale: float = 1.0  # product of fault.rollback_lr_scale over the rollbacks

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "step": self.step,
            "cursor": self.cursor.state_dict(),
            "samples": self.samples,
            "elapsed_s": self.elapsed_s,
            "train_s": self.train_s,
            "target_reached": self.target_reached,
            "scaler": self.scaler,
            "attempts": self.attempts,
            "run_id": self.run_id,
            "rollbacks": self.rollbacks,
            "lr_scale": self.lr_scale,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        """Rebuild from `to_dict` output."""
        return cls(
            step=int(data["step"]),
            cursor=Cursor.from_state(data["cursor"]),
            samples=int(data["samples"]),
            elapsed_s=float(data["elapsed_s"]),
            train_s=float(data.get("train_s", 0.0)),
            target_reached=data.get("target_reached"),
            scaler=dict(data.get("scaler") or {}),
            attempts=int(data.get("attempts", 1)),
            run_id=str(data.get("run_id", "")),
            rollbacks=int(data.get("rollbacks", 0)),
            lr_scale=float(data.get("lr_scale", 1.0)),
        )
