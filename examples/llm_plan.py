"""Llama-3-shaped transformers (8B and 70B parameters) for `tandem plan`: on the meta
device nothing is allocated, so a laptop plans a cluster's run.

    tandem plan examples/llm_plan.py --task llama3_8b --global-batch 16 --machine 8xH100-80GB
    tandem plan examples/llm_plan.py --task llama3_70b --global-batch 64 --machine 64xH100-80GB

The shapes are Llama 3's (grouped-query attention, SwiGLU MLP, RMSNorm, untied 128256-token
embedding and head, 8192-token sequences); the data are random tokens, enough for a plan
(and for a short run of a small variant: `python examples/llm_plan.py` trains a 4-layer
model of width 128 on them).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

import tandem


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int,
                 hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) if self.embed is not None else tokens
        for block in self.blocks:
            if block is not None:
                x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x) if self.head is not None else x


class RandomTokens(Dataset):
    """`n` sequences of `seq` + 1 random tokens below `vocab` (seeded)."""

    def __init__(self, vocab: int, seq: int, n: int = 64) -> None:
        self.x = torch.randint(0, vocab, (n, seq + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i, :-1], self.x[i, 1:]


def loss(logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[1].flatten())


def optimizer(params: object) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1)


def _task(vocab: int, seq: int, **shape: int) -> tandem.Task:
    return tandem.Task(model=partial(Llama, vocab, **shape), optimizer=optimizer,
                       train_data=partial(RandomTokens, vocab, seq), loss=loss,
                       forward=lambda model, batch: model(batch[0]),
                       tensor_parallel={"blocks.*.attn.q": "colwise",
                                        "blocks.*.attn.k": "colwise",
                                        "blocks.*.attn.v": "colwise",
                                        "blocks.*.attn.o": "rowwise",
                                        "blocks.*.gate": "colwise", "blocks.*.up": "colwise",
                                        "blocks.*.down": "rowwise"})


llama3_8b = _task(128256, 8192, dim=4096, layers=32, heads=32, kv_heads=8, hidden=14336)
llama3_70b = _task(128256, 8192, dim=8192, layers=80, heads=64, kv_heads=8, hidden=28672)
small = _task(256, 64, dim=128, layers=4, heads=4, kv_heads=2, hidden=344)

if __name__ == "__main__":
    tandem.fit(small)
