"""Fine-tune the demo's MNIST-1D CNN on a shifted variant of the data.

The variant is MNIST-1D generated with another seed, 1.6 times the correlated noise and
2.5 times the white noise (`SHIFTED`): the same ten templates, other samples, noisier.
The demo's model (`examples/mnist1d_cnn.py`, run directory `runs/mnist1d_cnn`) scores
lower on it than on its own test set; fine-tuning starts from its weights
(`run.init_from`) and trains at 0.3 times the demo's learning rates (`--lr-scale`).

    tandem run --nproc-per-node 2 examples/mnist1d_cnn.py            # the demo, first
    tandem run --nproc-per-node 2 examples/mnist1d_finetune.py
    tandem run --nproc-per-node 2 examples/mnist1d_finetune.py --train.freeze '0.*,2.*'
    tandem run --nproc-per-node 2 examples/mnist1d_finetune.py --run.init_from '' \\
        --run.name scratch --lr-scale 1                                # from scratch
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist1d_model  # noqa: E402
from mnist1d_cnn import accuracy  # noqa: E402
from mnist1d_model import make_model  # noqa: E402

SHIFTED = {"seed": 7, "corr_noise_scale": 0.4, "iid_noise_scale": 0.05}


@cache
def shifted() -> dict[str, torch.Tensor]:
    """The shifted variant (generated offline by the `mnist1d` package, about a second)."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    for key, value in SHIFTED.items():
        setattr(args, key, value)
    data = make_dataset(args)
    return {"x": torch.tensor(data["x"], dtype=torch.float32).unsqueeze(1),
            "y": torch.tensor(data["y"], dtype=torch.int64),
            "x_test": torch.tensor(data["x_test"], dtype=torch.float32).unsqueeze(1),
            "y_test": torch.tensor(data["y_test"], dtype=torch.int64)}


def muon(scale: float):
    """The demo's Muon + AdamW with both learning rates times `scale`."""
    from tandem.optim import Muon

    def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = list(params)
        return Muon([{"params": [p for p in params if p.ndim > 2],
                      "lr": mnist1d_model.MUON_LR * scale},
                     {"params": [p for p in params if p.ndim <= 2], "muon": False,
                      "lr": mnist1d_model.ADAM_LR * scale, "betas": (0.9, 0.99)}],
                    momentum=0.95)

    return make


task = tandem.Task(
    model=make_model,
    optimizer=muon(0.3),
    train_data=lambda: TensorDataset(shifted()["x"], shifted()["y"]),
    eval_data=lambda: TensorDataset(shifted()["x_test"], shifted()["y_test"]),
    loss=tandem.CrossEntropy(),
    metrics={"accuracy": accuracy},
)

RECIPE = {
    "run.init_from": "runs/mnist1d_cnn",
    "train.steps": 100,
    "train.global_batch": 128,
    "train.eval_every": 10,
    "train.eval_batch": 500,
    "train.target": "accuracy>=0.78",
    "data.in_memory": True,
    "optim.schedule": "warmup_cosine",
    "optim.warmup_steps": 3,
    "monitor.log_every": 10,
}

if __name__ == "__main__":
    choice = argparse.ArgumentParser(add_help=False)
    choice.add_argument("--lr-scale", type=float, default=0.3)
    known, rest = choice.parse_known_args()
    tandem.fit(dataclasses.replace(task, optimizer=muon(known.lr_scale)), argv=rest,
               defaults=RECIPE)
