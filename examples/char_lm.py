"""A small decoder-only transformer trained on Python's own standard-library sources.

Byte-level (256 symbols), no tokenizer, no download: the corpus is the `.py` files of
the running interpreter's standard library, read in sorted order and cut at
`CORPUS_BYTES`. The last 5% of the corpus is held out for validation.

The recipe is the speedrun record (`benchmarks/speedrun.py`): Muon on the blocks'
matrices, AdamW on the rest, bf16 autocast (`--precision.mode fp32` for full precision;
bf16 pays on CPUs with AVX-512 BF16 and on GPUs, and can be slow on CPUs without it),
64-byte windows for the first 40 steps, a 100-step schedule, evaluations only where the
target (validation loss <= 2.3 nats) can fall.

    python examples/char_lm.py                                  # one process
    tandem run --nproc-per-node 2 examples/char_lm.py           # two processes
    tandem run --nproc-per-node 2 examples/char_lm.py --optimizer adamw --train.steps 300
    tandem run --nproc-per-node 4 examples/char_lm.py --plan.tp 2   # 2 data x 2 tensor
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sysconfig
from functools import cache
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

import tandem

SEQ_LEN = 128
CORPUS_BYTES = 4_000_000
VOCAB = 256


@cache
def corpus() -> torch.Tensor:
    """The standard library's Python sources as one uint8 tensor (deterministic order)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= CORPUS_BYTES:
            break
    text = b"".join(chunks)[:CORPUS_BYTES]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


class Windows(Dataset):
    """Non-overlapping windows of SEQ_LEN + 1 bytes: inputs and next-byte targets."""

    def __init__(self, split: str) -> None:
        data = corpus()
        cut = int(len(data) * 0.95)
        self.data = data[:cut] if split == "train" else data[cut:]

    def __len__(self) -> int:
        return (len(self.data) - 1) // SEQ_LEN

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.data[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1].long()
        return window[:-1], window[1:]


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q/k/v projections."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            # Heads counted from the width at hand: under tensor parallelism (plan.tp)
            # this rank holds heads / tp of them.
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                             split(self.v(x)), is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """The feed-forward part of a block (4x expansion, GELU)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.proj = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    """A GPT-style byte-level language model."""

    def __init__(self, dim: int = 128, layers: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        # [1, positions, dim]: 3-D, so that no optimizer mistakes it for a weight matrix.
        self.pos = nn.Parameter(torch.zeros(1, SEQ_LEN, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied input and output embeddings
        for name, p in self.named_parameters():
            if p.dim() == 2 and name != "pos":
                nn.init.normal_(p, std=0.02)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))
        nn.init.normal_(self.pos, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under plan.pp a stage holds some of the parts: the others are None.
        if self.embed is not None:
            x = self.embed(x) + self.pos[:, : x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x) if self.head is not None else x


def loss(logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean next-byte cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[1].flatten())


def bits_per_byte(logits: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy in bits: what a compressor built on the model would spend per byte."""
    return loss(logits, batch) / math.log(2)


def optimizer(params: object) -> torch.optim.Optimizer:
    """AdamW with the usual transformer betas."""
    return torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)  # type: ignore[arg-type]


MUON_LR, ADAM_LR = 0.04, 6e-3


def muon(params: object) -> torch.optim.Optimizer:
    """Muon on the blocks' weight matrices, AdamW on the embedding (tied to the head, the
    one matrix with VOCAB rows), the positions (3-D) and the norms: modded-nanogpt's split."""
    from tandem.optim import Muon

    params = list(params)  # type: ignore[call-overload]
    matrices = [p for p in params if p.ndim == 2 and p.shape[0] != VOCAB]
    rest = [p for p in params if not (p.ndim == 2 and p.shape[0] != VOCAB)]
    return Muon([{"params": matrices, "lr": MUON_LR},
                 {"params": rest, "muon": False, "lr": ADAM_LR, "betas": (0.9, 0.95)}])


OPTIMIZERS = {"muon": muon, "adamw": optimizer}


task = tandem.Task(
    model=CharLM,
    optimizer=muon,
    train_data=lambda: Windows("train"),
    eval_data=lambda: Windows("val"),
    loss=loss,
    metrics={"bits_per_byte": bits_per_byte},
    tokens_per_sample=SEQ_LEN,
    # plan.tp > 1 splits each block Megatron-style: q/k/v and fc by output columns (heads
    # and hidden units), the projections after them by input rows.
    tensor_parallel={
        "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise",
        "blocks.*.attn.v": "colwise", "blocks.*.attn.proj": "rowwise",
        "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise",
    },
)

RECIPE = {
    "train.steps": 100,
    "train.global_batch": 32,
    "train.eval_every": 10,
    "train.eval_from": 80,
    "train.seq_ramp": "0:64,40:0",
    "train.eval_batch": 64,
    "train.grad_clip": 1.0,
    "train.target": "eval_loss<=2.3",
    "data.in_memory": True,
    "optim.schedule": "warmup_cosine",
    "optim.warmup_steps": 15,
    "optim.min_lr_ratio": 0.1,
    "precision.mode": "bf16",
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
