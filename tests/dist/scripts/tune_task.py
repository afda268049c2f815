"""A small regression job for the tuner: each sample costs TUNE_TASK_SLEEP_MS of loading.

Evaluation (held-out pairs, no loading cost) gives `eval_loss`, so a time-to-target goal
such as `--train.target 'eval_loss<=0.1'` works for `tandem tune --hparams`.

With the default 2 ms per sample and `data.workers` 0 the step waits on its data: an
input-bound job a tuner should fix with loader workers. With TUNE_TASK_SLEEP_MS=0 the
job is already well configured. TUNE_TASK_WIDTH sets the hidden width (more compute).
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

import tandem

SLEEP_S = float(os.environ.get("TUNE_TASK_SLEEP_MS", "2")) / 1000.0
WIDTH = int(os.environ.get("TUNE_TASK_WIDTH", "64"))
N_SAMPLES = 2048


class SlowData(Dataset):
    """Fixed random regression pairs; every item costs SLEEP_S, like a decode from disk."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N_SAMPLES, 16, generator=g)
        self.w = torch.randn(16, 4, generator=g)
        self.y = torch.tanh(self.x @ self.w) + 0.05 * torch.randn(N_SAMPLES, 4, generator=g)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if SLEEP_S:
            time.sleep(SLEEP_S)
        return self.x[i], self.y[i]


class EvalData(SlowData):
    """Held-out pairs from the same function, loaded without a cost."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(99)
        self.x = torch.randn(512, 16, generator=g)
        self.y = torch.tanh(self.x @ self.w) + 0.05 * torch.randn(512, 4, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4))


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def loss(out: torch.Tensor, batch) -> torch.Tensor:
    return nn.functional.mse_loss(out, batch[1])


task = tandem.Task(model=make_model, optimizer=make_optimizer, train_data=SlowData,
                   eval_data=EvalData, loss=loss)

RECIPE = {"train.steps": 60, "train.global_batch": 32, "monitor.log_every": 5,
          "data.workers": 0, "monitor.calibrate_at": 0}

if __name__ == "__main__":
    tandem.fit(task, defaults=RECIPE)
