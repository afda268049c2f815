"""MNIST-1D with a model whose gradients are worth compressing: a training script (a Task).

The recipe's CNN (`examples/mnist1d_model.py`) has 63k parameters, so its all-reduce is
a fraction of a millisecond and no communication plan can matter. This model keeps a
narrow version of that CNN as a feature extractor (width 32, global average pooling:
the translation invariance that makes MNIST-1D easy) and puts a wide MLP on top of it:

    CNN(width 32) -> pool -> Linear(32, H) -> GELU -> [Linear(H, H) -> GELU] x (D - 1)
                  -> Linear(H, 10)

With H = 2048 and D = 2 that is 4.3 M parameters (17 MB of fp32 gradients per step),
almost all of them in two weight matrices, while a step stays cheap on a CPU
(~1 ms of compute per sample forward and backward). H and D come from the environment
(WIDE_MNIST1D_HIDDEN, WIDE_MNIST1D_DEPTH) because a training script's command line
carries only tandem's own flags:

    tandem run --nproc-per-node 2 benchmarks/wide_mnist1d.py
    WIDE_MNIST1D_HIDDEN=1024 tandem run --nproc-per-node 2 benchmarks/wide_mnist1d.py \\
        --plan.comm_hook powersgd

The recipe is the example's shape (AdamW with decoupled weight decay on matrices only,
global batch 128, linear warm-up then cosine, evaluation on the 1000 test samples)
with a lower peak learning rate (1e-3), which the wide layers need.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "src"))

import mnist1d_cnn as example  # noqa: E402

import tandem  # noqa: E402

HIDDEN = int(os.environ.get("WIDE_MNIST1D_HIDDEN", "2048"))
DEPTH = int(os.environ.get("WIDE_MNIST1D_DEPTH", "2"))
TRUNK = 32
LR = float(os.environ.get("WIDE_MNIST1D_LR", "1e-3"))


def make_model(hidden: int = HIDDEN, depth: int = DEPTH, trunk: int = TRUNK) -> nn.Module:
    """The wide model: input [batch, 1, 40] float32, output [batch, 10] logits."""
    layers: list[nn.Module] = [nn.Conv1d(1, trunk, 5, padding=2), nn.GELU()]
    for _ in range(3):
        layers += [nn.Conv1d(trunk, trunk, 5, padding=2), nn.GroupNorm(8, trunk), nn.GELU()]
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(trunk, hidden), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    layers.append(nn.Linear(hidden, 10))
    return nn.Sequential(*layers)


def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices and kernels only (the example's recipe, lr 1e-3)."""
    params = list(params)
    decay = [p for p in params if p.ndim > 1]
    rest = [p for p in params if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99))


# The example's task (data, loss, accuracy) with the wide model and its optimizer.
task = dataclasses.replace(example.task, model=make_model, optimizer=make_optimizer)

RECIPE = {
    "train.steps": 600,
    "train.global_batch": 128,
    "train.eval_every": 50,
    "train.eval_batch": 500,
    "train.target": "accuracy>=0.95",
    "optim.schedule": "warmup_cosine",
    "optim.warmup_steps": 30,
    "checkpoint.every": 0,
    "checkpoint.at_end": False,
    "monitor.log_every": 25,
}

if __name__ == "__main__":
    tandem.fit(task, defaults=RECIPE)
