"""The components a config asks for, in the order they run, before the user's own."""

from __future__ import annotations

from tandem.components.base import Component
from tandem.components.ema import EMA
from tandem.components.faults import FaultInjection
from tandem.components.liveness import Liveness
from tandem.components.model import Compile, Recompute
from tandem.components.task_losses import task_losses
from tandem.compress.distill import from_config as distillation
from tandem.config import Config
from tandem.finetune.freeze import Freeze, parse_patterns
from tandem.finetune.init_from import InitFrom
from tandem.finetune.lora import LoRA
from tandem.finetune.peft_model import PeftAdapters
from tandem.runtime import Runtime
from tandem.task import Task


def builtin(config: Config, runtime: Runtime, task: Task) -> list[Component]:
    """Freezing and the initial weights first (every later component sees the model they
    make), activation checkpointing before compilation (as the plan applies them), the
    weight average, the record of each source's loss of a mixture, the teacher (before an
    injected fault scales the loss), then liveness before fault injection (a rank killed
    by a fault is last seen where it was killed)."""
    out: list[Component] = [PeftAdapters(config.train.lora_rank)]  # a user's PeftModel
    if config.train.freeze:
        out.append(Freeze(parse_patterns(config.train.freeze)))
    if config.train.lora_rank:
        out.append(LoRA(config.train.lora_rank, config.train.lora_alpha,
                        parse_patterns(config.train.lora_targets)))
    if config.run.init_from:
        out.append(InitFrom(config.run.init_from, config.run.init_partial,
                            map_weights=task.map_weights))
    if config.plan.activation_checkpointing:
        out.append(Recompute())
    if config.plan.compile:
        out.append(Compile())
    if config.train.ema_decay:
        out.append(EMA(config.train.ema_decay))
    out += task_losses(task)
    if (teacher := distillation(config, task)) is not None:
        out.append(teacher)
    out.append(Liveness(runtime.store, runtime.rank, runtime.world_size,
                        config.fault.heartbeat_s))
    if (faults := FaultInjection.planned(runtime.rank, runtime.restart_count)) is not None:
        out.append(faults)
    return out
