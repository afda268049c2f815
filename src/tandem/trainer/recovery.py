"""The trainer's checkpoint side: resume, commit, preempt, roll back."""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tandem import checkpoint
from tandem.monitor.progress import Reporter
from tandem.trainer.guard import Preempted
from tandem.trainer.state import TrainState

if TYPE_CHECKING:
    from tandem.trainer.loop import Trainer

log = logging.getLogger("tandem")


def checkpoint_root(trainer: Trainer) -> Path:
    """Where the run's checkpoints live."""
    return trainer.run_dir / "checkpoints"


def _tensors(trainer: Trainer) -> dict:
    tensors = checkpoint.capture(trainer.model, trainer.optimizer)
    if trainer.lowcomm is not None:
        tensors["lowcomm"] = trainer.lowcomm.state_dict()
    return tensors


def _load(trainer: Trainer, path: Path) -> TrainState:
    tensors = _tensors(trainer)
    meta = checkpoint.load(path, tensors)
    checkpoint.restore(trainer.model, trainer.optimizer, tensors)
    if trainer.lowcomm is not None:
        trainer.lowcomm.load_state_dict(tensors["lowcomm"])
    state = TrainState.from_dict(meta["train_state"])
    trainer.precision.load_state_dict(state.scaler)
    return state


def resume(trainer: Trainer) -> Path | None:
    """Load the latest good checkpoint, as `run.resume` says. All ranks."""
    policy = trainer.config.run.resume
    root = checkpoint_root(trainer)
    found = checkpoint.latest(root)
    if found is None:
        if policy == "require":
            raise ValueError(f"run.resume: 'require' but {root} holds no committed checkpoint")
        return None
    if policy == "never":
        raise ValueError(
            f"run.resume: 'never' but {trainer.run_dir} already holds checkpoints; choose "
            "another run.name or run.resume 'auto' (nothing was overwritten)"
        )
    trainer.state = _load(trainer, found)
    trainer.state.attempts += 1
    return found


def save(trainer: Trainer, reporter: Reporter) -> Path:
    """Commit the current state as a checkpoint; record how long training was blocked."""
    state = trainer.state
    state.scaler = trainer.precision.state_dict()
    meta = {"train_state": state.to_dict(), "config": trainer.config.to_dict(),
            "world_size": trainer.runtime.world_size}
    started = time.perf_counter()
    path = checkpoint.save(checkpoint_root(trainer), state.step, _tensors(trainer), meta,
                           keep=trainer.config.checkpoint.keep)
    blocked = time.perf_counter() - started
    reporter.record(state.step, {"time/checkpoint_blocking_s": blocked})
    trainer.last_saved = state.step
    if trainer.faults is not None:
        trainer.faults.hit("checkpoint", state.step, path)
    return path


def preempt(trainer: Trainer, reporter: Reporter) -> None:
    """Commit a checkpoint at this step boundary and stop with a resumable status."""
    path = checkpoint_root(trainer) / f"step_{trainer.state.step:09d}"
    if trainer.last_saved != trainer.state.step:
        path = save(trainer, reporter)
    reporter.event(trainer.state.step, "preempted",
                   f"preempted: checkpoint {path} committed at step {trainer.state.step}; "
                   "run the same command again to continue")
    status_file = os.environ.get("TANDEM_STATUS_FILE")
    if status_file and trainer.runtime.is_main:
        Path(status_file).write_text(f"preempted {trainer.state.step}\n")
    raise Preempted(trainer.state.step, str(path))


def rollback(trainer: Trainer, bad_step: int, reason: str, reporter: Reporter) -> None:
    """Restore the newest checkpoint before `bad_step` and skip the data since then.

    PaLM's remedy for loss spikes, done by the run itself: weights, optimizer and
    schedule go back to the last good checkpoint, the data position stays where it is
    (the batches in between are skipped), the lr is optionally lowered, and the
    checkpoints taken after the bad step are set aside. All ranks.
    """
    cfg, now = trainer.config.fault, trainer.state
    if now.rollbacks >= cfg.max_rollbacks:
        raise RuntimeError(f"{reason}; fault.max_rollbacks ({cfg.max_rollbacks}) reached")
    root = checkpoint_root(trainer)
    found = checkpoint.latest(root, before=bad_step)
    if found is None:
        raise RuntimeError(f"{reason}; no good checkpoint before step {bad_step} to roll "
                           "back to (checkpoint.every sets how often they are taken)")
    restored = _load(trainer, found)
    skipped = now.samples - restored.samples
    restored.cursor = copy.deepcopy(now.cursor)
    restored.samples, restored.train_s, restored.elapsed_s = now.samples, now.train_s, now.elapsed_s
    restored.rollbacks = now.rollbacks + 1
    restored.lr_scale = now.lr_scale * cfg.rollback_lr_scale
    restored.run_id, restored.attempts = now.run_id, now.attempts
    restored.target_reached = now.target_reached
    trainer.state = restored
    trainer.lr.extra = restored.lr_scale
    aside = checkpoint.set_aside(root, bad_step)
    reporter.event(now.step, "rollback",
                   f"{reason}: rolled back from step {now.step} to {found.name} (step "
                   f"{restored.step}), skipping {skipped} samples; lr x{restored.lr_scale:g}"
                   + (f"; set aside {len(aside)} later checkpoint(s)" if aside else ""),
                   value=float(bad_step))
