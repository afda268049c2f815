"""Restoring a run from its checkpoints: at start (`resume`, as run.resume says) and after a
fault (`rollback` to the last good checkpoint before a bad step). Both work on the
checkpoint manager, whose states the run's component list derived, and the names of the
states to load: nothing here knows which parts the run has."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tandem import checkpoint
from tandem.checkpoint import CheckpointManager
from tandem.config import Config, FaultConfig, config_from_dict
from tandem.errors import UsageError
from tandem.trainer import resume_rules
from tandem.trainer.progress import Reporter
from tandem.trainer.resumed import Resumed
from tandem.trainer.state import STRATEGY, Progress


@dataclass(frozen=True)
class Loaded:
    """What `resume` did: what it found, and the optional states the checkpoint lacked."""

    resumed: Resumed
    fresh: list[str]  # states not loaded (optional ones the checkpoint lacks, another
    # plan's strategy state): their owners start afresh


def resume(checkpoints: CheckpointManager, config: Config, run_dir: Path,
           optimizer: dict[str, Any], optional: Sequence[str],
           done: Any) -> Loaded:
    """Load the latest good checkpoint, as `run.resume` says; check what changed since.

    `optimizer` is the optimizer's record now (`optimizer_record`); `optional` names the
    states a checkpoint may lack (an add-on switched on at this resume); `done()` says,
    once loaded, whether the run is complete. Raise UsageError (on every rank alike) where
    the run must not go on: checkpoints exist but none verifies, 'never' / 'require' not
    met, or a guarded setting changed. All ranks.
    """
    policy, root = config.run.resume, checkpoints.root
    if policy == "fresh":
        moved = checkpoint.set_aside(root, 0, "set-aside")
        return Loaded(Resumed(None, [], moved, False), [])
    found, problems = checkpoints.find()
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
        return Loaded(Resumed(None, [], [], False), [])
    if policy == "never":
        raise UsageError(
            f"run.resume: 'never' but {run_dir} already holds checkpoints; choose "
            "another run.name or run.resume 'auto' (nothing was overwritten)")
    meta = checkpoint.read_meta(found)
    step = int(found.name.removeprefix("step_"))
    old = config_from_dict(meta.get("config", {}))
    warning = resume_rules.check(old, config, step, (meta.get("optimizer"), optimizer))
    saved = meta.get("states", {})
    fresh = [name for name in optional if name not in saved]
    world = dist.get_world_size() if dist.is_initialized() else 1
    saved_world = int(meta.get("world_size", world))
    if not resume_rules.plan_state_kept(old, config, saved_world, world):
        fresh.append(STRATEGY)  # another plan's: this plan's starts from the loaded weights
    elif STRATEGY in checkpoints.states:  # a plan that resizes reads every replica
        held = checkpoints.states[STRATEGY]
        getattr(held, "state", held).expect_saved_world(saved_world)
    names = [name for name in checkpoints.states if name not in fresh]
    if resume_rules.OPTIMIZER in warning:  # another optimizer, allowed: start its state
        names.remove("optim")
    checkpoints.restore(found, names)
    return Loaded(Resumed(found, problems, [], done(), warning), fresh)


def rollback(checkpoints: CheckpointManager, names: list[str], progress: Progress,
             fault: FaultConfig, now: int, bad_step: int, reason: str,
             reporter: Reporter) -> int:
    """Restore the states `names` from the newest checkpoint before `bad_step`, skip the
    data since then; return the step restored.

    PaLM's remedy for loss spikes, done by the run itself: weights, optimizer and
    schedule go back to the last good checkpoint, the data position (`progress`) stays
    where it is (the batches in between are skipped), the lr is optionally lowered, and
    the checkpoints taken after the bad step are set aside. `now`: the step the run had
    reached. All ranks.
    """
    if progress.rollbacks >= fault.max_rollbacks:
        raise RuntimeError(f"{reason}; fault.max_rollbacks ({fault.max_rollbacks}) reached")
    found, _ = checkpoints.find(before=bad_step)
    if found is None:
        raise RuntimeError(f"{reason}; no good checkpoint before step {bad_step} to roll "
                           "back to (checkpoint.every sets how often they are taken)")
    meta = checkpoints.restore(found, names)
    skipped = progress.samples - int(meta["states"]["progress"]["samples"])
    progress.rollbacks += 1
    progress.lr_scale *= fault.rollback_lr_scale
    step = int(found.name.removeprefix("step_"))
    aside = checkpoint.set_aside(checkpoints.root, bad_step)
    reporter.event(now, "rollback",
                   f"{reason}: rolled back from step {now} to {found.name} (step "
                   f"{step}), skipping {skipped} samples; lr x{progress.lr_scale:g}"
                   + (f"; set aside {len(aside)} later checkpoint(s)" if aside else ""),
                   value=float(bad_step))
    return step
