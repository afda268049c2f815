"""What a resumed run may change, and what it must be told to change.

Free on resume: how long and how the run goes (train.steps under a schedule that does
not depend on it, evaluation and checkpoint cadence, world size, plan, data loading,
monitoring, fault handling, the target). Guarded: what changes the training math from
the step it resumes at (the global batch and its ramp, the seed and with it the sample
order, a mixture's shares (data.mix), the precision, the schedule's shape, and
train.steps when the schedule is stretched over it, the optimizer's own settings). A
guarded change is refused with a table of old vs new values unless `run.allow_changes`
names it (or is "all"); an allowed one is applied with the same table as a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.config import Config
from tandem.errors import UsageError
from tandem.optim.schedule import lr_multiplier
from tandem.parallel.registry import REGISTRY

GUARDED = ("train.global_batch", "train.batch_ramp", "run.seed", "precision.mode",
           "train.label_smoothing", "train.seq_ramp", "data.mix")
GUARDED_SECTIONS = ("optim",)
OPTIMIZER = "optimizer"  # the pseudo-key of the optimizer's type and settings
IGNORED_GROUP_KEYS = ("params", "lr", "initial_lr")  # lr is the schedule's, every step


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, fields in config.items()
            if isinstance(fields, Mapping) for key, value in fields.items()}


def _stretched(optim: Mapping[str, Any]) -> bool:
    """Whether the schedule (lr or momentum) is laid out over train.steps."""
    return (optim.get("schedule") in ("warmup_cosine", "onecycle", "warmup_linear", "wsd")
            or optim.get("momentum_schedule") == "onecycle")


def guarded_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any,
                                                                                   Any]]:
    """(key, old, new) for every guarded key whose value differs between two configs."""
    before, after = _flat(old), _flat(new)
    keys = [k for k in after if k in GUARDED or k.split(".")[0] in GUARDED_SECTIONS]
    if _stretched(old.get("optim", {})) or _stretched(new.get("optim", {})):
        keys.append("train.steps")
    return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]


def optimizer_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[
        tuple[str, Any, Any]]:
    """The optimizer's type and param-group settings, old vs new, where they differ."""
    if not old:
        return []

    def settings(record: Mapping[str, Any]) -> dict[str, Any]:
        groups = [{k: v for k, v in g.items() if k not in IGNORED_GROUP_KEYS}
                  for g in record.get("param_groups", [])]
        return {"type": record.get("type"), "param_groups": groups}

    a, b = settings(old), settings(new)
    return [(OPTIMIZER, a, b)] if a != b else []


def _shown(value: Any) -> str:
    if isinstance(value, Mapping) and "type" in value:  # an optimizer record
        groups = value.get("param_groups") or [{}]
        settings = ", ".join(f"{k}={v}" for k, v in groups[0].items())
        return f"{value['type']!r} ({settings})"
    return repr(value)


def plan_state_kept(old: Config, new: Config, old_world: int, world: int) -> bool:
    """Whether the checkpoint's strategy state is the new plan's to load (else the new
    plan's starts afresh from the weights loaded: DiLoCo's outer parameters are them).

    A plan whose checkpoints hold every replica (between meetings the run's own model
    section holds, tensor by tensor, any one of them) resumes only as itself, with the
    same parts and world size (a plan that `resizes`: at any world size): raise
    UsageError otherwise."""
    before, now = old.plan, new.plan
    info = REGISTRY[before.strategy]
    if not info.saves_replicas:
        return before.strategy == now.strategy
    if info.resizes and now.strategy == before.strategy:
        return True
    if (now.strategy, now.fragments, world) != (before.strategy, before.fragments, old_world):
        raise UsageError(
            f"run.resume: the checkpoint holds the replicas of plan.strategy "
            f"{before.strategy!r} (plan.fragments {before.fragments}) on {old_world} "
            f"processes, which differ between meetings; resume it with the same plan on "
            f"{old_world} processes (now: {now.strategy!r}, plan.fragments {now.fragments}, "
            f"{world} processes), or start a new run from its weights with run.init_from")
    return True


def lr_note(old: Config, new: Config, step: int) -> str:
    """The lr multiplier at the resume step under the old and the new schedule."""
    before = lr_multiplier(old.optim, step, old.train.steps)
    after = lr_multiplier(new.optim, step, new.train.steps)
    return f"lr multiplier at step {step}: {before:.4g} -> {after:.4g}"


def check(old: Config, new: Config, step: int, optimizers: tuple[Mapping[str, Any] | None,
                                                                Mapping[str, Any]]) -> str:
    """Raise UsageError for guarded changes `run.allow_changes` does not name; return a
    warning (empty when nothing guarded changed)."""
    found = guarded_changes(old.to_dict(), new.to_dict()) + optimizer_changes(*optimizers)
    if not found:
        return ""
    allowed = {k.strip() for k in new.run.allow_changes.split(",") if k.strip()}
    table = "; ".join(f"{key}: {_shown(a)} -> {_shown(b)}" for key, a, b in found)
    if any(key.startswith(("optim.", "train.steps")) for key, _, _ in found):
        table += f"; {lr_note(old, new, step)}"
    refused = [key for key, _, _ in found if "all" not in allowed and key not in allowed]
    if refused:
        raise UsageError(
            f"resuming at step {step} with settings that change the training math: "
            f"{table}. Nothing was changed. To resume with them anyway, add "
            f"--run.allow_changes {','.join(refused)} (or 'all'); to keep the old run, "
            "give this one another --run.name")
    return f"resuming at step {step} with changed settings (run.allow_changes): {table}"
