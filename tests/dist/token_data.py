"""The char-LM tests' data and task: byte sequences with fixed pseudo-random starts, next =
previous + 1, and the example's model under AdamW."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import Dataset

import tandem

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import char_lm  # noqa: E402


class Tokens(Dataset):
    """`n` sequences of `t` + 1 bytes from a seeded generator (a learnable rule)."""

    def __init__(self, n: int, t: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, 200, (n, 1), generator=g)
        self.x = (start + torch.arange(t + 1)) % char_lm.VOCAB

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i, :-1], self.x[i, 1:]


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def char_lm_task(data_seed: int, n: int, t: int, dim: int, layers: int, heads: int,
                 evaluate: bool = False, tensor_parallel: bool = False) -> tandem.Task:
    """The example's model (`dim`, `layers`, `heads`) on `Tokens(n, t, data_seed)`, also
    as evaluation data when `evaluate`; the example's tensor-parallel plan when asked."""
    data = partial(Tokens, n, t, data_seed)
    return tandem.Task(model=partial(char_lm.CharLM, dim=dim, layers=layers, heads=heads),
                       optimizer=adamw, train_data=data, eval_data=data if evaluate else None,
                       loss=char_lm.loss,
                       tensor_parallel=char_lm.task.tensor_parallel if tensor_parallel else None)
