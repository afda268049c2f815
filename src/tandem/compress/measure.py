"""What `tandem compress` measures of each model: the task's metric on its evaluation
data, the weights it holds (elements and serialised bytes) and its CPU inference latency
at batch 1 and batch 64, the models interleaved so that the machine's drift falls on all
of them alike."""

from __future__ import annotations

import copy
import io
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from tandem.compress.quant import Int8Layer
from tandem.task import Task

BATCHES = (1, 64)  # the inference batch sizes latency is measured at
LOSS = "eval_loss"


class _Captured(Exception):  # noqa: N818 - control flow, not an error
    def __init__(self, args: tuple[Any, ...]) -> None:
        super().__init__("captured")
        self.args_ = args


class _Capture(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise ValueError("tandem compress: the model takes keyword arguments "
                             f"({sorted(kwargs)}); it exports models called with "
                             "positional tensors only")
        raise _Captured(args)


def collate_of(task: Task, dataset: Any) -> Callable[[list[Any]], Any]:
    """How the task makes one batch of samples."""
    return task.collate or getattr(dataset, "collate_fn", None) or default_collate


def model_inputs(task: Task, batch: Any) -> tuple[torch.Tensor, ...]:
    """The positional tensors the task's forward hands the model for `batch`."""
    try:
        task.run_forward(_Capture(), batch)
    except _Captured as got:
        if not all(isinstance(a, torch.Tensor) for a in got.args_):
            raise ValueError("tandem compress: the model's inputs must be tensors; got "
                             f"{[type(a).__name__ for a in got.args_]}") from None
        return got.args_
    raise ValueError("tandem compress: the task's forward did not call the model")


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, dataset: Any, metric: str,
             batch_size: int) -> float:
    """The metric over the whole dataset: each batch's mean, weighted by its samples."""
    collate = collate_of(task, dataset)
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(dataset), batch_size):
        idx = range(start, min(start + batch_size, len(dataset)))
        batch = collate([dataset[i] for i in idx])
        outputs = task.run_forward(model, batch)
        fn = task.metrics.get(metric) if metric != LOSS else task.loss
        value = fn(outputs, batch)  # type: ignore[misc]
        total += float(value) * len(idx)
        count += len(idx)
    return total / count


def weights(model: nn.Module) -> int:
    """Weight elements the model holds: its parameters and its int8 layers' weights."""
    from torch.ao.nn.quantized import dynamic

    int8 = sum(m.weight_int8.numel() + (0 if m.bias is None else m.bias.numel())
               for m in model.modules() if isinstance(m, Int8Layer))
    kernels = sum(m.weight().numel() + (0 if m.bias() is None else m.bias().numel())
                  for m in model.modules() if isinstance(m, dynamic.Linear))
    return sum(p.numel() for p in model.parameters()) + int8 + kernels


def state_bytes(model: nn.Module) -> int:
    """Bytes of the model's state dict as `torch.save` writes it (the weights a program
    file holds: for a model on fbgemm's kernels, those of its exported twin)."""
    from tandem.compress import quant

    if quant.has_kernels(model):
        model = quant.emulated(copy.deepcopy(model))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def _per_call(fn: Callable[[], Any], budget_s: float) -> tuple[int, float]:
    """(calls per measurement so that one takes about `budget_s`, seconds of one call)."""
    fn()  # warm-up
    calls, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s or calls >= 1 << 14:
            return calls, elapsed / calls
        calls *= 2


@torch.no_grad()
def latencies(models: Mapping[str, nn.Module], inputs: Sequence[torch.Tensor],
              repeats: int = 5, budget_s: float = 0.02) -> dict[str, dict[int, float]]:
    """Milliseconds per call at each batch of `BATCHES` (the median of `repeats`
    measurements, the models interleaved within each repeat)."""
    fns: dict[tuple[str, int], Callable[[], Any]] = {}
    for name, model in models.items():
        model.eval()
        for size in BATCHES:
            args = tuple(_rows(t, size) for t in inputs)
            fns[name, size] = lambda m=model, a=args: m(*a)
    calls = {key: _per_call(fn, budget_s)[0] for key, fn in fns.items()}
    seen: dict[tuple[str, int], list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls[key]):
                fn()
            seen[key].append(1000 * (time.perf_counter() - start) / calls[key])
    return {name: {size: statistics.median(seen[name, size]) for size in BATCHES}
            for name in models}


def _rows(t: torch.Tensor, size: int) -> torch.Tensor:
    """`size` rows of `t`, repeating its rows when it has fewer."""
    if t.shape[0] >= size:
        return t[:size]
    return t.repeat(-(-size // t.shape[0]), *[1] * (t.dim() - 1))[:size]
