"""Knowledge distillation: the student also learns a frozen teacher's softened outputs.

The loss trained on is (Hinton, Vinyals & Dean, 2015)

    ratio * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - ratio) * Task.loss

with t and s the teacher's and the student's logits (the classes along the last
dimension) and T the temperature. The divergence is summed over the classes and averaged
over every other position (each sample; each token of a sequence), so the term is a mean
over the batch like `Task.loss`, and N processes train what one does. T^2 keeps the soft
term's gradient at the scale of the hard term's as T grows.

The teacher is built once per process (`Task.teacher`, else `Task.model`), loaded from a
tandem run, a checkpoint or safetensors (`train.distill_from`, through `run.init_from`'s
loader; the weight average where the run kept one: the weights it evaluated) unless its
factory returns it trained, moved to the run's device, put in eval
mode with every parameter frozen, and kept beside the distributed model: no strategy
wraps it (no gradient, so nothing to reduce), and every rank holds it whole (under FSDP2
too: it is not sharded). Its forward
runs under `torch.no_grad` inside the step, on the micro-batch the student sees, and its
time per step is the window's `time/teacher` (a part of `time/forward`).

With `train.distill_cache_mb` > 0 the teacher's outputs are kept per training sample, keyed
by the bytes of the sample's inputs, up to that many megabytes: a sample seen again (the
next epoch) takes its stored outputs and the teacher runs on the unseen rows only. An
augmented sample differs in its bytes and is computed afresh. It assumes what eval mode
gives the usual models: a sample's outputs do not depend on the other rows of its batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem.components.base import Component, RunParts
from tandem.config import Config
from tandem.errors import UsageError
from tandem.finetune.init_from import InitFrom
from tandem.monitor.catalogue import TIME_TEACHER
from tandem.task import Batch, Task, default_forward

FIELD = "train.distill_from"


def soft_loss(student: torch.Tensor, teacher: torch.Tensor,
              temperature: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)), summed over the last
    dimension and averaged over the others (float32)."""
    classes = student.shape[-1]
    s = F.log_softmax(student.float().reshape(-1, classes) / temperature, dim=-1)
    t = F.log_softmax(teacher.float().reshape(-1, classes) / temperature, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * temperature**2


class OutputCache(nn.Module):
    """Calls `teacher` on the rows of its inputs it has not seen; the others' outputs come
    from the store (see the module docstring). Inputs whose tensors do not share a first
    dimension, or outputs that are not one tensor of that many rows, pass through."""

    def __init__(self, teacher: nn.Module, limit_bytes: int) -> None:
        super().__init__()
        self.teacher, self.limit = teacher, limit_bytes
        self.store: dict[bytes, torch.Tensor] = {}
        self.held = 0
        self.hits = self.misses = 0

    @staticmethod
    def keys(args: Sequence[Any]) -> list[bytes] | None:
        """One key per row: the bytes of the row of every input, or None."""
        if not args or not all(isinstance(a, torch.Tensor) and a.dim() > 0 for a in args):
            return None
        rows = args[0].shape[0]
        if any(a.shape[0] != rows for a in args):
            return None
        flat = torch.cat([a.detach().reshape(rows, -1).contiguous().view(torch.uint8)
                          .reshape(rows, -1).cpu() for a in args], dim=1).numpy()
        return [row.tobytes() for row in flat]

    def forward(self, *args: Any) -> Any:
        keys = self.keys(args)
        if keys is None:
            return self.teacher(*args)
        new = [i for i, k in enumerate(keys) if k not in self.store]
        self.hits, self.misses = self.hits + len(keys) - len(new), self.misses + len(new)
        if len(new) == len(keys):
            out = self.teacher(*args)
        elif new:
            out = self.teacher(*(a[new] for a in args))
        else:
            return torch.stack([self.store[k] for k in keys])
        if not isinstance(out, torch.Tensor) or out.shape[0] != len(new):
            return out if len(new) == len(keys) else self.teacher(*args)
        fresh = dict(zip((keys[i] for i in new), out.detach(), strict=True))
        for key, row in fresh.items():
            size = row.numel() * row.element_size() + len(key)
            if self.held + size <= self.limit:
                self.store[key] = row.clone()
                self.held += size
        if len(new) == len(keys):
            return out
        return torch.stack([fresh[k] if k in fresh else self.store[k] for k in keys])


def _shape(value: Any) -> str:
    return str(list(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


class Distill(Component):
    """Adds the distillation term to every micro-batch's loss (see the module docstring).

    `teacher` builds the teacher's module; `weights` (optional) is where its trained
    weights are: a tandem run directory, a checkpoint directory, a .safetensors file or a
    folder of them. `forward(model, batch)` gives a model's outputs on a batch (the
    task's; by default `Task`'s default).
    """

    def __init__(self, teacher: Callable[[], nn.Module], weights: str | Path = "",
                 temperature: float = 1.0, ratio: float = 0.5,
                 forward: Callable[[nn.Module, Batch], Any] | None = None,
                 cache_mb: float = 0.0) -> None:
        if not callable(teacher):
            raise ValueError(f"Distill: teacher must be a callable that builds the teacher's "
                             f"module, got {teacher!r}")
        if not temperature > 0:
            raise ValueError(f"train.distill_temperature: {temperature!r} must be > 0")
        if not 0 <= ratio <= 1:
            raise ValueError(f"train.distill_ratio: {ratio!r} must be in [0, 1]")
        if not cache_mb >= 0:
            raise ValueError(f"train.distill_cache_mb: {cache_mb!r} must be >= 0")
        self.cache_bytes = int(cache_mb * 2**20)
        self.build, self.temperature, self.ratio = teacher, temperature, ratio
        self.forward = forward or default_forward
        # The source is checked at once, before any model is built.
        self.loader = (InitFrom(str(weights), field=FIELD, average=True) if str(weights)
                       else None)
        self.teacher: nn.Module | None = None
        self.cache: OutputCache | None = None
        self.checked = False
        self.in_step = False
        self.spans: list[tuple[Any, Any]] = []  # this window's teacher forwards
        self.steps = 0

    def setup(self, parts: RunParts) -> None:
        """Build, load and freeze the teacher on the run's device. Every rank."""
        teacher = self.build()
        if not isinstance(teacher, nn.Module):
            raise ValueError(f"the teacher's factory returned {type(teacher).__name__}, "
                             "not a torch.nn.Module")
        teacher.to(parts.device)
        if self.loader is not None:
            self.loader.load(teacher)
        teacher.eval()
        teacher.requires_grad_(False)
        self.teacher, self.cuda = teacher, parts.device.type == "cuda"
        if self.cache_bytes:
            self.cache = OutputCache(teacher, self.cache_bytes)

    def before_step(self, step: int) -> None:
        """Teacher time counts from here (not in the preflight check or calibration)."""
        self.in_step = True

    def after_step(self, step: int, skipped: bool) -> None:
        """One more step in the window."""
        self.in_step = False
        self.steps += 1

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        """The task's loss mixed with the distillation term of this micro-batch."""
        if self.ratio == 0:
            return loss
        taught = self.teach(batch)
        if not self.checked:
            self._check(outputs, taught)
        return (self.ratio * soft_loss(outputs, taught, self.temperature)
                + (1 - self.ratio) * loss)

    def teach(self, batch: Any) -> Any:
        """The teacher's outputs on `batch`, without gradients; timed inside a step. Only
        inside a step is the cache used (training samples, not preflight ones)."""
        assert self.teacher is not None, "setup() first"
        start = self._mark()
        model = self.cache if self.cache is not None and self.in_step else self.teacher
        with torch.no_grad():
            out = self.forward(model, batch)
        if self.in_step:
            self.spans.append((start, self._mark()))
        return out

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _check(self, student: Any, teacher: Any) -> None:
        """The same on every rank (one model, one teacher): a usage error, raised alike."""
        if not isinstance(student, torch.Tensor) or not isinstance(teacher, torch.Tensor):
            raise UsageError(f"distillation needs the student's and the teacher's outputs "
                             f"as logit tensors; got student {_shape(student)}, teacher "
                             f"{_shape(teacher)}")
        if student.shape != teacher.shape:
            raise UsageError(f"distillation: the teacher's outputs have shape "
                             f"{_shape(teacher)} and the student's {_shape(student)}; they "
                             "must match (the same classes along the last dimension)")
        self.checked = True

    def metrics(self) -> dict[str, float]:
        """The teacher's forward seconds per step in the window."""
        if not self.steps:
            return {}
        if self.cuda and self.spans:
            self.spans[-1][1].synchronize()
            total = sum(a.elapsed_time(b) for a, b in self.spans) / 1000.0
        else:
            total = sum(b - a for a, b in self.spans)
        per_step = total / self.steps
        self.spans, self.steps = [], 0
        return {TIME_TEACHER: per_step}


def from_config(config: Config, task: Task) -> Distill | None:
    """The distillation `train.distill_*` and `Task.teacher` ask for, or None."""
    train = config.train
    if not (train.distill_from or task.teacher is not None) or train.distill_ratio == 0:
        return None
    if config.plan.pp > 1 or config.plan.tp > 1:
        raise ValueError(f"distillation: the teacher runs whole beside the student on every "
                         f"rank; plan.pp {config.plan.pp} and plan.tp {config.plan.tp} split "
                         "the student's forward (use one process, ddp, fsdp, localsgd or "
                         "diloco)")
    return Distill(task.teacher or task.model, train.distill_from, train.distill_temperature,
                   train.distill_ratio, task.run_forward, train.distill_cache_mb)
