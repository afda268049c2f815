"""Decisions every rank must take together: preemption, interruption and rollback."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from tandem.status import ExitStatus, RunStatus

if TYPE_CHECKING:
    import torch

    from tandem.trainer.progress import Reporter


log = logging.getLogger("tandem")

# A second SIGINT this soon after the first is the same Ctrl-C (the terminal sends it to
# the launcher and to every worker, and torchrun forwards its own): not a second press.
SAME_PRESS_S = 1.0
STATUS_FILE_ENV = "TANDEM_STATUS_FILE"  # where rank 0 tells `tandem run` why it stopped


class Preempted(SystemExit):
    """The run stopped at a step boundary after committing a checkpoint; run it again."""

    def __init__(self, step: int, checkpoint: str) -> None:
        super().__init__(ExitStatus.PREEMPTED)
        self.step, self.checkpoint = step, checkpoint

    def __str__(self) -> str:
        return f"preempted at step {self.step}; resumable from {self.checkpoint}"


class Interrupted(Preempted):
    """Ctrl-C: the run stopped at a step boundary after committing a checkpoint."""

    def __init__(self, step: int, checkpoint: str) -> None:
        super().__init__(step, checkpoint)
        self.code = ExitStatus.INTERRUPTED

    def __str__(self) -> str:
        return f"interrupted at step {self.step}; resumable from {self.checkpoint}"


class PreemptionFlag:
    """Turns SIGTERM and a first Ctrl-C into a request to stop at the next agreed step
    boundary (with a checkpoint); a second Ctrl-C aborts at once (KeyboardInterrupt:
    committed checkpoints stay intact, the one being written is never committed)."""

    PREEMPT, INTERRUPT = 1, 2  # what `requested` holds; an interrupt outranks a preemption

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce  # say what happens (one rank speaks for the job)
        self.requested = 0
        self._first_sigint: float | None = None
        self._previous: dict[int, object] = {}
        if threading.current_thread() is threading.main_thread():
            for sig, handler in ((signal.SIGTERM, self._on_sigterm),
                                 (signal.SIGINT, self._on_sigint)):
                self._previous[sig] = signal.signal(sig, handler)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested and self.announce:
            log.warning("SIGTERM received: checkpointing at the next step boundary")
        self.requested = max(self.requested, self.PREEMPT)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._first_sigint is None:
            self._first_sigint = now
            if self.announce:
                log.warning("Ctrl-C: stopping at the next step boundary with a checkpoint; "
                            "press Ctrl-C again to stop at once without one")
        elif now - self._first_sigint >= SAME_PRESS_S:
            raise KeyboardInterrupt
        self.requested = self.INTERRUPT

    def close(self) -> None:
        """Put the previous signal handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous = {}


class StartupInterrupt:
    """Ctrl-C before training takes the signals over (`PreemptionFlag`): the process-group
    start, the preflight, the model's build. The first SIGINT leaves whatever start-up is
    doing (KeyboardInterrupt) and is remembered, so that the failure it causes here or on
    another rank (a collective whose peer left) is reported as what it is: one line, exit
    status 130, instead of every rank's traceback. Once closed, SIGINT is handled as
    before it was installed."""

    def __init__(self) -> None:
        self.received = False
        self.closed = False
        self._first = 0.0  # when the first SIGINT came (time.monotonic)
        self._previous: object = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.closed:  # put back by a handler that came after this one
            if callable(self._previous):
                self._previous(signum, frame)
            elif self._previous != signal.SIG_IGN:
                raise KeyboardInterrupt
            return
        now = time.monotonic()
        if not self.received:
            self.received, self._first = True, now
            raise KeyboardInterrupt
        if now - self._first >= SAME_PRESS_S:  # a second press: whatever caught the first
            raise KeyboardInterrupt

    def close(self) -> None:
        """Start-up is over: SIGINT goes back to the handler it had (a later handler that
        was installed over this one keeps it until it puts this one back)."""
        self.closed = True
        if self._previous is not None and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def exit(self, speak: bool) -> None:
        """Stop this process with status 130; `speak`: say why (one rank for the job)."""
        if speak:
            sys.stderr.write("tandem: interrupted during start-up, before the first step; "
                             "nothing was trained or committed by this launch - run the same "
                             "command again to start\n")
        raise SystemExit(ExitStatus.INTERRUPTED)


@dataclass(frozen=True)
class Decision:
    """What all ranks agreed on at a logging-window boundary."""

    stop: int  # 0: go on; PreemptionFlag.PREEMPT or INTERRUPT: commit and stop
    rollback_before: int  # 0: no rollback; else roll back to a checkpoint before this step
    recalibrate: bool = False  # measure the link's cost again (the step time drifted)


def agree(stop: int, rollback_before: int, device: torch.device,
          recalibrate: bool = False) -> Decision:
    """Combine every rank's view with one all-reduce (MAX). Must be called on all ranks."""
    import torch  # here: the launcher imports this module's constants, not torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return Decision(stop, rollback_before, recalibrate)
    flags = torch.tensor([float(stop), float(rollback_before), float(recalibrate)],
                         dtype=torch.float64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return Decision(int(flags[0].item()), int(flags[1].item()), bool(flags[2].item()))


def stop_committed(step: int, path: str, interrupt: bool, is_main: bool,
                   reporter: Reporter) -> NoReturn:
    """Stop at a step boundary whose checkpoint `path` is committed, with a resumable
    status: Interrupted (Ctrl-C) or Preempted (SIGTERM; the scheduler's cancel and resize
    say so in the event). All ranks."""
    kind = RunStatus.INTERRUPTED if interrupt else RunStatus.PREEMPTED
    from tandem.sched.service.attempt import scheduler_stop  # a cancel is not a preemption

    words, then = (None if interrupt else scheduler_stop()) or (
        kind, "run the same command again to continue")
    reporter.event(step, kind, f"{words}: checkpoint {path} committed at step {step}; {then}")
    status_file = os.environ.get(STATUS_FILE_ENV)
    if status_file and is_main:  # how `tandem run` learns why it stopped
        Path(status_file).write_text(f"{kind} {step}\n")
    raise (Interrupted if interrupt else Preempted)(step, path)
