"""A stack of wide linear blocks trained with Adam under a data-segment memory limit.

TANDEM_DATA_LIMIT_MB, when set, caps this process's data segment (RLIMIT_DATA: heap and
private mappings) at what it uses after start-up plus that many MiB, before fit() builds
anything. Used to show a model whose weights + gradients + Adam state exceed the cap train
under FSDP with deferred initialisation on 2 processes, and fail on one.
"""

from __future__ import annotations

import os
import resource

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tandem

WIDTH = int(os.environ.get("BIG_MODEL_WIDTH", "1024"))
BLOCKS = int(os.environ.get("BIG_MODEL_BLOCKS", "16"))


def data_segment_bytes() -> int:
    """This process's VmData (heap + private writable mappings), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def make_model() -> nn.Module:
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS)))


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, WIDTH, generator=g), torch.randn(64, WIDTH, generator=g))


task = tandem.Task(
    model=make_model,
    optimizer=lambda params: torch.optim.Adam(params, lr=1e-4),
    train_data=make_data,
    loss=lambda out, batch: nn.functional.mse_loss(out, batch[1]),
)

if __name__ == "__main__":
    limit_mb = os.environ.get("TANDEM_DATA_LIMIT_MB")
    if limit_mb:
        cap = data_segment_bytes() + int(float(limit_mb) * 2**20)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    tandem.fit(task, defaults={"train.steps": 3, "train.global_batch": 4,
                               "checkpoint.at_end": False, "monitor.calibrate_at": 0,
                               "monitor.log_every": 1})
