"""Task: what the user supplies, as factories, so tandem can build them per process."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

Batch = Any
LossFn = Callable[[Any, Batch], torch.Tensor]
MetricFn = Callable[[Any, Batch], torch.Tensor | float]


@dataclass(kw_only=True)
class Task:
    """A training job described once: model, optimizer, data, loss and metrics.

    Every field that builds state is a zero-argument factory (the optimizer takes the
    parameters), so each process builds its own copy after the process group and the
    device are set up.

    ``loss(outputs, batch)`` must return the *mean* loss over the samples of ``batch``:
    tandem scales it so that N processes x K accumulation steps give the gradient of
    one process on the whole global batch. ``metrics`` are per-batch means too; tandem
    weights them by batch size when it reduces them across batches and ranks.

    ``loss`` and the metrics are called once on one training batch before the first step,
    without gradients (a preflight check that each returns one number), and ``loss`` a few
    extra times on one batch when the monitor calibrates (``monitor.calibrate_at``): they
    must have no side effects beyond their result.

    ``forward(model, batch)`` maps a batch to the model's outputs; the default calls
    ``model(batch[0])`` for a tuple/list batch, ``model(batch["input"])`` for a dict,
    and ``model(batch)`` otherwise.

    ``eval_views(batch)`` (optional) returns views of an evaluation batch (e.g. the batch
    and its shifted or flipped copies): evaluation then averages the model's outputs over
    them and scores the average against the batch (test-time augmentation). Include the
    batch itself if it should count. The outputs must be tensors of one shape.
    ``train.eval_views false`` turns it off without changing the task.

    ``collate(samples)`` (optional) makes one batch of a list of samples, e.g. pads
    sequences of different lengths; without it a dataset's own ``collate_fn`` attribute
    is used, else torch's ``default_collate``. It is called on the samples of one
    micro-batch (one rank's share of one accumulation pass), in training and evaluation,
    so its batch must not depend on which other samples share the global batch: a loss
    that ignores padding gives the same training at every process count.

    ``tensor_parallel`` names the layers to split when ``plan.tp`` > 1: module path
    patterns (fnmatch, e.g. ``"blocks.*.attn.q"``) mapped to ``"colwise"`` or
    ``"rowwise"``. A column-wise layer keeps its output sharded over the tensor-parallel
    group; the row-wise layer that follows takes that shard and sums the partial outputs.
    The model's forward must work on the local shard (e.g. count heads from the local
    width: ``view(b, t, -1, head_dim)``, not ``view(b, t, heads, -1)``).

    ``teacher`` (optional) builds a teacher's module for knowledge distillation
    (``tandem.compress.distill``): trained as built, or loaded from ``train.distill_from``.
    Its outputs must have the shape of the model's.

    ``map_weights`` (optional) renames the keys of the weights ``run.init_from`` loads
    before they are matched to the model's names: ``map_weights(key)`` returns the model's
    name for the source's ``key``, or None to leave the key out, so a checkpoint saved
    under another library's names loads (e.g. ``lambda k: k.removeprefix("model.")``).

    ``components`` (optional) makes the run's own components (``tandem.Component``:
    freeze parameters, add a term to the loss, keep a state in checkpoints), after the
    ones the config asks for; ``fit(..., components=[...])`` adds more after these.
    """

    model: Callable[[], nn.Module]
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    train_data: Callable[[], Dataset]
    loss: LossFn
    eval_data: Callable[[], Dataset] | None = None
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)
    forward: Callable[[nn.Module, Batch], Any] | None = None
    tokens_per_sample: int | None = None
    tensor_parallel: Mapping[str, str] | None = None
    eval_views: Callable[[Batch], Sequence[Batch]] | None = None
    collate: Callable[[list[Any]], Batch] | None = None
    components: Callable[[], Sequence[Any]] | None = None
    teacher: Callable[[], nn.Module] | None = None
    map_weights: Callable[[str], str | None] | None = None

    def __post_init__(self) -> None:
        for name in ("model", "optimizer", "train_data", "loss"):
            if not callable(getattr(self, name)):
                raise ValueError(f"Task.{name} must be callable, got {getattr(self, name)!r}")
        for name in ("eval_data", "eval_views", "collate", "components", "teacher",
                     "map_weights"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"Task.{name} must be callable or None, got "
                                 f"{getattr(self, name)!r}")
        for key, fn in self.metrics.items():
            if not callable(fn):
                raise ValueError(f"Task.metrics[{key!r}] must be callable, got {fn!r}")
        for pattern, style in (self.tensor_parallel or {}).items():
            if style not in ("colwise", "rowwise"):
                raise ValueError(f"Task.tensor_parallel[{pattern!r}]: {style!r} is not a "
                                 "style; use 'colwise' or 'rowwise'")
        if self.tokens_per_sample is not None and self.tokens_per_sample <= 0:
            raise ValueError(
                "Task.tokens_per_sample must be a positive int or None, "
                f"got {self.tokens_per_sample}"
            )

    def run_forward(self, model: nn.Module, batch: Batch) -> Any:
        """Call the model on a batch, through the user's ``forward`` if one is given."""
        if self.forward is not None:
            return self.forward(model, batch)
        return default_forward(model, batch)


def default_forward(model: nn.Module, batch: Batch) -> Any:
    """``model(batch[0])`` for a tuple/list batch, ``model(batch["input"])`` for a dict,
    ``model(batch)`` otherwise (`Task.forward` when none is given)."""
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    if isinstance(batch, dict):
        if "input" not in batch:
            raise ValueError(
                f"a dict batch (keys {sorted(batch)}) is passed to the model as "
                "batch['input']; it has no 'input' key: give Task.forward = "
                "lambda model, batch: model(...) to say what the model takes")
        return model(batch["input"])
    return model(batch)


def module_task(script: str | Path, name: str | None, command: str) -> Task:
    """The Task `script` defines at module level (by `name` when it defines several), its
    main part not run; `command` (e.g. "tandem plan") names the asker in errors."""
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"{command}: no script at {script}")
    sys.path.insert(0, str(path.resolve().parent))  # the script's own imports
    found = runpy.run_path(str(path), run_name="__tandem_module__")
    tasks = {k: v for k, v in found.items() if isinstance(v, Task)}
    if name is not None:
        if name not in tasks:
            raise ValueError(f"{command}: {script} has no module-level Task named {name!r}; "
                             f"it has {sorted(tasks)}")
        return tasks[name]
    if len(tasks) != 1:
        raise ValueError(f"{command}: {script} defines {len(tasks)} module-level Tasks "
                         f"({sorted(tasks)}); name one with --task")
    return next(iter(tasks.values()))
