"""Restoring a run from its checkpoints: at start (`resume`, as run.resume says) and after a
fault (`rollback` to the last good checkpoint before a bad step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem import checkpoint
from tandem.config import config_from_dict
from tandem.errors import UsageError
from tandem.monitor.progress import Reporter
from tandem.trainer import resume_rules
from tandem.trainer.resumed import Resumed, optimizer_record

if TYPE_CHECKING:
    from tandem.trainer.loop import Trainer

# What a rollback restores; the run's Progress (data consumed, time, faults) stays.
ROLLBACK_STATES = ["model", "optim", "strategy", "precision", "train"]


def resume(trainer: Trainer) -> Resumed:
    """Load the latest good checkpoint, as `run.resume` says; check what changed since.

    Raise UsageError (on every rank alike) where the run must not go on: checkpoints
    exist but none verifies, 'never' / 'require' not met, or a guarded setting changed.
    All ranks.
    """
    policy, root = trainer.config.run.resume, trainer.checkpoints.root
    if policy == "fresh":
        moved = checkpoint.set_aside(root, 0, "set-aside")
        return Resumed(None, [], moved, False)
    found, problems = trainer.checkpoints.find()
    if found is None:
        if problems:
            raise UsageError(
                f"run.resume: {root} holds {len(problems)} checkpoint(s) and none "
                f"verifies ({'; '.join(problems[:3])}); nothing was changed or deleted. "
                "To start over, run again with --run.resume fresh (they are moved "
                "aside under the same folder, not deleted)")
        if policy == "require":
            raise UsageError(f"run.resume: 'require' but {root} holds no committed "
                             "checkpoint")
        return Resumed(None, [], [], False)
    if policy == "never":
        raise UsageError(
            f"run.resume: 'never' but {trainer.run_dir} already holds checkpoints; choose "
            "another run.name or run.resume 'auto' (nothing was overwritten)")
    meta = checkpoint.read_meta(found)
    step = int(found.name.removeprefix("step_"))
    warning = resume_rules.check(config_from_dict(meta.get("config", {})), trainer.config,
                                 step, (meta.get("optimizer"),
                                        optimizer_record(trainer.optimizer)))
    names = list(trainer.checkpoints.states)
    fresh_average = "ema" in names and "ema" not in meta.get("states", {})
    if fresh_average:  # averaging switched on at this resume: start from the weights
        names.remove("ema")
    if resume_rules.OPTIMIZER in warning:  # another optimizer, allowed: start its state
        names.remove("optim")
    trainer.checkpoints.restore(found, names)
    if fresh_average and trainer.ema is not None:
        trainer.ema.reset()
    trainer.progress.attempts += 1
    trainer.lr.extra = trainer.progress.lr_scale
    done = trainer.state.step >= trainer.config.train.steps or (
        trainer.config.train.stop_at_target and trainer.progress.target_reached is not None)
    return Resumed(found, problems, [], done, warning)


def rollback(trainer: Trainer, bad_step: int, reason: str, reporter: Reporter) -> None:
    """Restore the newest checkpoint before `bad_step` and skip the data since then.

    PaLM's remedy for loss spikes, done by the run itself: weights, optimizer and
    schedule go back to the last good checkpoint, the data position stays where it
    is (the batches in between are skipped), the lr is optionally lowered, and the
    checkpoints taken after the bad step are set aside. All ranks.
    """
    cfg, was = trainer.config.fault, trainer.state.step
    if trainer.progress.rollbacks >= cfg.max_rollbacks:
        raise RuntimeError(f"{reason}; fault.max_rollbacks ({cfg.max_rollbacks}) reached")
    found, _ = trainer.checkpoints.find(before=bad_step)
    if found is None:
        raise RuntimeError(f"{reason}; no good checkpoint before step {bad_step} to roll "
                           "back to (checkpoint.every sets how often they are taken)")
    meta = trainer.checkpoints.restore(
        found, ROLLBACK_STATES + (["ema"] if trainer.ema is not None else []))
    skipped = trainer.progress.samples - int(meta["states"]["progress"]["samples"])
    trainer.progress.rollbacks += 1
    trainer.progress.lr_scale *= cfg.rollback_lr_scale
    trainer.lr.extra = trainer.progress.lr_scale
    aside = checkpoint.set_aside(trainer.checkpoints.root, bad_step)
    reporter.event(was, "rollback",
                   f"{reason}: rolled back from step {was} to {found.name} (step "
                   f"{trainer.state.step}), skipping {skipped} samples; lr "
                   f"x{trainer.progress.lr_scale:g}"
                   + (f"; set aside {len(aside)} later checkpoint(s)" if aside else ""),
                   value=float(bad_step))
