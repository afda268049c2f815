"""The candidates `tandem compress` weighs against the original: each technique at two
levels, made from a copy of the trained model by the compression building blocks, with the
short fine-tune each needs (`FineTune`).

- low-rank: every Linear and ConvNd whose pair is smaller replaced by its truncated-SVD
  pair holding 50% or 25% of the layer's weights, then fine-tuned;
- pruning: 25% or 50% of each coupled channel group masked (lowest group L2 norm; the
  output layer's channels kept, and groups tied to an embedding or a bare parameter, such
  as a transformer's residual stream), the share growing on a cubic schedule over the first
  half of the fine-tune, then removed, the smaller model fine-tuned for the second half;
- int8 PTQ: weights and inputs quantised, input ranges calibrated on training batches,
  converted, no training;
- int8 QAT: fake-quantised, fine-tuned (ranges followed while training), converted;
  both with their Linear layers on fbgemm's int8 kernels (`quant.kernels`).

Beside them, the original fine-tuned the same way (`finetuned`): a control for what the
extra training alone gives (an undertrained model improves with it, compressed or not).

A candidate that cannot be made (a layer torch-pruning cannot mask, a missing package) is
returned as the reason why, not raised: the others are still weighed.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from tandem.compress import lowrank, prune, quant
from tandem.compress.distill import soft_loss
from tandem.compress.measure import collate_of
from tandem.task import Task

FINETUNED = "finetuned"  # the control's name
LOWRANK_SHARES = (0.5, 0.25)
PRUNE_RATIOS = (0.25, 0.5)
CALIBRATION_BATCHES = 8


@dataclass(frozen=True)
class FineTune:
    """How a candidate is fine-tuned: the task's optimizer, its learning rates scaled by
    `lr_scale` and decayed to 0 on a cosine over `steps`, batches of `batch` training
    samples drawn in an order fixed by `seed`. With a `teacher` (the original model) and
    `distill` > 0, the loss is `distill.soft_loss` of the teacher's outputs mixed with the
    task's (`distill` the ratio, at `temperature`): a compressed student learns from the
    model it replaces."""

    task: Task
    steps: int
    batch: int
    lr_scale: float
    seed: int
    teacher: nn.Module | None = None
    distill: float = 0.0
    temperature: float = 2.0

    def batches(self) -> Iterator[Any]:
        """Training batches, reshuffled each pass, without end."""
        data = self.task.train_data()
        loader = DataLoader(data, batch_size=min(self.batch, len(data)), shuffle=True,
                            drop_last=True, collate_fn=collate_of(self.task, data),
                            generator=torch.Generator().manual_seed(self.seed))
        return itertools.chain.from_iterable(itertools.repeat(loader))

    def run(self, model: nn.Module, after_step: Callable[[], None] | None = None,
            span: tuple[int, int] | None = None) -> None:
        """Train `model` in place for `steps` steps, or for the steps `span` (start, stop)
        of them: their batches and learning rates, with an optimizer of its own."""
        start, stop = span or (0, self.steps)
        torch.manual_seed(self.seed + start)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = self.task.optimizer(params)
        base = [g["lr"] * self.lr_scale for g in optimizer.param_groups]
        model.train()
        batches = itertools.islice(self.batches(), start, stop)
        for step, batch in zip(range(start, stop), batches, strict=False):
            for group, lr in zip(optimizer.param_groups, base, strict=True):
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / self.steps))
            outputs = self.task.run_forward(model, batch)
            loss = self.task.loss(outputs, batch)
            if self.teacher is not None and self.distill:
                with torch.no_grad():
                    taught = self.task.run_forward(self.teacher, batch)
                loss = (self.distill * soft_loss(outputs, taught, self.temperature)
                        + (1 - self.distill) * loss)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if after_step is not None:
                after_step()
        model.eval()


def output_layer(model: nn.Module, inputs: Sequence[torch.Tensor]) -> str | None:
    """The last Linear or ConvNd to run whose output has the model's output shape: its
    channels are the model's outputs (classes, vocabulary) and are never pruned."""
    ran: list[tuple[str, torch.Size]] = []
    hooks = [m.register_forward_hook(lambda mod, a, out, n=name: ran.append((n, out.shape)))
             for name, m in model.named_modules() if isinstance(m, prune.ROOTS)]
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    shape = out.shape if isinstance(out, torch.Tensor) else None
    return next((name for name, s in reversed(ran) if s == shape), None)


def finetuned(model: nn.Module, tune: FineTune) -> nn.Module:
    """The model itself fine-tuned as the others are: the control that tells what the
    extra training alone changes (never adopted: it is neither smaller nor faster)."""
    out = copy.deepcopy(model)
    tune.run(out)
    return out


def lowranked(model: nn.Module, share: float, tune: FineTune) -> nn.Module:
    """The model factorised to pairs holding `share` of each layer's weights, fine-tuned."""
    out = copy.deepcopy(model)
    if not lowrank.factorise(out, params=share):
        raise ValueError("no layer's pair would be smaller")
    tune.run(out)
    return out


def pruned(model: nn.Module, ratio: float, inputs: Sequence[torch.Tensor],
           tune: FineTune, gradual: bool = True) -> nn.Module:
    """`ratio` of each channel group masked over the first half of the fine-tune, the
    masked channels removed, the smaller model fine-tuned for the second half (a norm
    that mixes channels, such as GroupNorm, computes other statistics once they are gone).
    `gradual`: the masked share grows on the cubic schedule over the first half
    (`prune.ChannelPruning`, the lowest group norms of the weights as they train); else
    all of it is masked before the first step."""
    out = copy.deepcopy(model)
    example = inputs[0] if len(inputs) == 1 else tuple(inputs)
    head = output_layer(out, inputs)
    graph = prune.graph(out, example)
    keep = (head,) if head else ()
    keep += tuple(prune.tied(out, example, keep, graph))
    half = max(1, tune.steps // 2)
    pruning = prune.ChannelPruning(example, ratio, start=0, end=half if gradual else 0,
                                   every=max(1, half // 10) if gradual else half, keep=keep)
    pruning.transform_model(out, torch.device("cpu"))
    if not gradual:
        pruning.masked = prune.choose(out, example, ratio, keep=keep, dep_graph=graph)
        prune.apply(out, example, pruning.masked, graph)
    steps = itertools.count(1)
    tune.run(out, lambda: pruning.after_step(next(steps), False), span=(0, half))
    if not any(pruning.masked.values()):
        raise ValueError("no channel group to prune")
    prune.remove(out, example, pruning.masked)
    if half < tune.steps:
        tune.run(out, span=(half, tune.steps))
    return out.eval()


def int8_ptq(model: nn.Module, tune: FineTune, bits: int = 8, group: int | None = None,
             fast: bool = True) -> nn.Module:
    """Quantised after training: input ranges from a few training batches; the Linear
    layers on fbgemm's int8 kernels (`fast`, int8 only). `bits` 4 with a `group`:
    int4 weights alone, per group (computed in float)."""
    out = copy.deepcopy(model)
    quant.prepare(out, bits=bits, group=group, activations=bits == 8)
    out.eval()
    with torch.no_grad(), quant.calibrating(out):
        for batch in itertools.islice(tune.batches(), CALIBRATION_BATCHES):
            tune.task.run_forward(out, batch)
    return _fast(quant.convert(out), fast and bits == 8)


def int8_qat(model: nn.Module, tune: FineTune, bits: int = 8, group: int | None = None,
             fast: bool = True) -> nn.Module:
    """Fine-tuned under fake quantisation, then converted (as `int8_ptq`)."""
    out = copy.deepcopy(model)
    quant.prepare(out, bits=bits, group=group, activations=bits == 8)
    tune.run(out)
    return _fast(quant.convert(out), fast and bits == 8)


def _fast(model: nn.Module, fast: bool) -> nn.Module:
    if fast:
        quant.kernels(model)
    return model.eval()


def candidates(model: nn.Module, inputs: Sequence[torch.Tensor],
               tune: FineTune) -> Iterator[tuple[str, nn.Module | str]]:
    """(name, the compressed model or why it could not be made), one candidate at a time."""
    makers: list[tuple[str, Callable[[], nn.Module]]] = [
        (FINETUNED, lambda: finetuned(model, tune)),
        *((f"lowrank-{round(100 * s)}%", lambda s=s: lowranked(model, s, tune))
          for s in LOWRANK_SHARES),
        *((f"prune-{round(100 * r)}%", lambda r=r: pruned(model, r, inputs, tune))
          for r in PRUNE_RATIOS),
        ("int8-ptq", lambda: int8_ptq(model, tune)),
        ("int8-qat", lambda: int8_qat(model, tune)),
    ]
    for name, make in makers:
        try:
            yield name, make()
        except (ValueError, RuntimeError, NotImplementedError) as err:
            yield name, f"could not be made: {err}"
