"""Two tasks trained jointly: MNIST-1D digits, and the parity of the digit on a noisier
MNIST-1D variant, by one CNN trunk with a head each (`tandem.Mixture`).

Source `digit`: the standard MNIST-1D split (4000 train / 1000 test), ten classes.
Source `parity`: the noisier variant of `mnist1d_finetune.py` (other samples, 1.6 times
the correlated and 2.5 times the white noise), labelled even/odd. The trunk is the
demo's CNN without its classifier (`mnist1d_model.make_model`); each source has its
own linear head and its own accuracy (`task/digit/accuracy`, `task/parity/accuracy`).

    tandem run --nproc-per-node 2 examples/mnist1d_multitask.py
    tandem run --nproc-per-node 2 examples/mnist1d_multitask.py --data.mix digit=1,parity=3
    tandem run --nproc-per-node 2 examples/mnist1d_multitask.py --data.mix temperature=2
    python examples/mnist1d_multitask.py --only parity          # one source alone
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mnist1d_cnn import accuracy  # noqa: E402
from mnist1d_finetune import shifted  # noqa: E402
from mnist1d_model import MNIST1D, make_model, make_muon  # noqa: E402


class TwoHeads(nn.Module):
    """The demo's CNN trunk (features [batch, 64]) with a digit head and a parity head.
    Both heads run on every sample; each source's loss reads its own."""

    def __init__(self) -> None:
        super().__init__()
        cnn = make_model()
        self.trunk = cnn[:-1]
        self.digit = cnn[-1]
        self.parity = nn.Linear(self.digit.in_features, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.trunk(x)
        return {"digit": self.digit(features), "parity": self.parity(features)}


def parity_data(train: bool) -> TensorDataset:
    """The noisier variant, labelled by the parity of its digit."""
    data = shifted()
    x, y = (data["x"], data["y"]) if train else (data["x_test"], data["y_test"])
    return TensorDataset(x, y % 2)


def cross_entropy(logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]
                  ) -> torch.Tensor:
    """Mean cross-entropy of a source's head against its labels."""
    return F.cross_entropy(logits, batch[1])


SOURCES = {
    "digit": tandem.Source(name="digit", train=lambda: MNIST1D(train=True),
                           eval=lambda: MNIST1D(train=False), loss=cross_entropy,
                           head="digit", metrics={"accuracy": accuracy}),
    "parity": tandem.Source(name="parity", train=lambda: parity_data(True),
                            eval=lambda: parity_data(False), loss=cross_entropy,
                            head="parity", metrics={"accuracy": accuracy}),
}

RECIPE = {
    "train.steps": 150,
    "train.global_batch": 128,
    "train.eval_every": 50,
    "train.eval_batch": 500,
    "train.ema_decay": 0.9,
    "data.in_memory": True,
    "optim.schedule": "warmup_cosine",
    "optim.warmup_steps": 7,
    "monitor.log_every": 25,
}


def mixture(only: str | None) -> tandem.Mixture:
    """Both sources (shares by size; `--data.mix` sets others), or one alone."""
    return tandem.Mixture([SOURCES[only]] if only else list(SOURCES.values()))


def main() -> None:
    """Train the mixture the flags choose; the rest of the flags are tandem's."""
    choice = argparse.ArgumentParser(add_help=False)
    choice.add_argument("--only", choices=sorted(SOURCES), default=None)
    known, rest = choice.parse_known_args()
    mix = mixture(known.only)
    task = tandem.Task(model=TwoHeads, optimizer=make_muon, train_data=mix.train,
                       eval_data=mix.eval, loss=mix.loss)
    tandem.fit(task, argv=rest, defaults=RECIPE)


if __name__ == "__main__":
    main()
