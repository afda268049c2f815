"""MNIST-1D with a 1-D CNN: 99% test accuracy in a few seconds on 2 CPU processes.

MNIST-1D (Greydanus, 2020) is generated offline by the `mnist1d` package: 4000 training
and 1000 test sequences of length 40, ten classes. The paper's CNN reaches 94%, a human
about 96%. The recipe here is the speedrun record (`benchmarks/speedrun.py`): the CNN of
`mnist1d_model.py` trained by Muon, evaluated on an average of its weights, batches
gathered from memory, evaluations only where the target can fall.

    tandem run --nproc-per-node 2 examples/mnist1d_cnn.py
    tandem run --nproc-per-node 2 examples/mnist1d_cnn.py --optimizer adamw --train.steps 1000
    python examples/mnist1d_cnn.py --train.steps 300          # one process
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mnist1d_model import MNIST1D, make_model, make_muon, make_optimizer  # noqa: E402


def accuracy(logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Fraction of the batch classified correctly."""
    return (logits.argmax(1) == batch[1]).float().mean()


task = tandem.Task(
    model=make_model,
    optimizer=make_muon,
    train_data=lambda: MNIST1D(train=True),
    eval_data=lambda: MNIST1D(train=False),
    loss=tandem.CrossEntropy(),
    metrics={"accuracy": accuracy},
)

OPTIMIZERS = {"muon": make_muon, "adamw": make_optimizer}

RECIPE = {
    "train.steps": 150,
    "train.global_batch": 128,
    "train.eval_every": 25,
    "train.eval_batch": 500,
    "train.target": "accuracy>=0.99",
    "train.ema_decay": 0.9,
    "data.in_memory": True,
    "optim.schedule": "warmup_cosine",
    "optim.warmup_steps": 7,
    "monitor.log_every": 25,
}


def main() -> None:
    """Train the recipe; `--optimizer adamw` swaps Muon for the earlier AdamW recipe."""
    choice = argparse.ArgumentParser(add_help=False)
    choice.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="muon")
    known, rest = choice.parse_known_args()
    tandem.fit(dataclasses.replace(task, optimizer=OPTIMIZERS[known.optimizer]), argv=rest,
               defaults=RECIPE)


if __name__ == "__main__":
    main()
