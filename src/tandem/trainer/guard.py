"""Decisions every rank must take together: preemption and rollback."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger("tandem")

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: try again later, the run is resumable
STATUS_FILE_ENV = "TANDEM_STATUS_FILE"  # where rank 0 tells `tandem run` why it stopped


class Preempted(SystemExit):
    """The run stopped at a step boundary after committing a checkpoint; run it again."""

    def __init__(self, step: int, checkpoint: str) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.step, self.checkpoint = step, checkpoint

    def __str__(self) -> str:
        return f"preempted at step {self.step}; resumable from {self.checkpoint}"


class PreemptionFlag:
    """Turns SIGTERM into a request to stop at the next agreed step boundary."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            log.warning("SIGTERM received: checkpointing at the next step boundary")
        self.requested = True

    def close(self) -> None:
        """Put the previous SIGTERM handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
            self._previous = None


@dataclass(frozen=True)
class Decision:
    """What all ranks agreed on at a logging-window boundary."""

    preempt: bool
    rollback_before: int  # 0: no rollback; else roll back to a checkpoint before this step


def agree(preempt: bool, rollback_before: int, device: torch.device) -> Decision:
    """Combine every rank's view with one all-reduce (MAX). Must be called on all ranks."""
    if not dist.is_initialized():
        return Decision(preempt, rollback_before)
    flags = torch.tensor([float(preempt), float(rollback_before)], dtype=torch.float64,
                         device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return Decision(bool(flags[0].item()), int(flags[1].item()))
