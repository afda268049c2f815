"""A classification MLP whose shape and input cost are set from the environment.

The jobs of benchmarks/misconfigured.py (and the tuner's tests) run this one script
with different settings; the script itself is always the same, well-behaved task.

    MC_IN, MC_WIDTH, MC_DEPTH   input features, hidden width, hidden layers (256, 512, 3)
    MC_N, MC_EVAL_N             training and evaluation samples (8192, 1024)
    MC_LOAD_MS                  milliseconds to load one training sample (0), spent
                                waiting as on a slow disk
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

import tandem

IN = int(os.environ.get("MC_IN", "256"))
WIDTH = int(os.environ.get("MC_WIDTH", "512"))
DEPTH = int(os.environ.get("MC_DEPTH", "3"))
N = int(os.environ.get("MC_N", "8192"))
EVAL_N = int(os.environ.get("MC_EVAL_N", "1024"))
LOAD_S = float(os.environ.get("MC_LOAD_MS", "0")) / 1000.0
CLASSES = 10


class Samples(Dataset):
    """Gaussian inputs labelled by a fixed random linear teacher."""

    def __init__(self, n: int, seed: int, load_s: float) -> None:
        g = torch.Generator().manual_seed(seed)
        teacher = torch.randn(IN, CLASSES, generator=torch.Generator().manual_seed(7))
        self.x = torch.randn(n, IN, generator=g)
        self.y = (self.x @ teacher).argmax(1)
        self.load_s = load_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.load_s:
            time.sleep(self.load_s)
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(IN, WIDTH), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


task = tandem.Task(
    model=make_model,
    optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    train_data=lambda: Samples(N, 1, LOAD_S),
    eval_data=lambda: Samples(EVAL_N, 2, 0.0),
    loss=lambda out, batch: nn.functional.cross_entropy(out, batch[1]),
    metrics={"accuracy": lambda out, batch: (out.argmax(1) == batch[1]).float().mean()},
)

if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 200, "train.global_batch": 128,
                               "monitor.log_every": 10})
