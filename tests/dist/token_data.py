"""Byte sequences for the char-LM tests: fixed pseudo-random starts, next = previous + 1."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset

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
