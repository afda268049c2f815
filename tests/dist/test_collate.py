"""A custom collate (Task.collate or a dataset's collate_fn) batches variable-length dict
samples; training is what one plain PyTorch process trains, at 1 and 2 processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import tandem
from tandem.data.sampler import epoch_order
from tandem.runtime import derive_seed
from tests.dist.procs import run_ranks
from tests.dist.toy_task import global_batches

N, VOCAB, STEPS, GLOBAL, SEED = 60, 20, 12, 12, 3


class Sequences(Dataset):
    """Dict samples whose token sequences have lengths 1..9: default_collate cannot stack
    them."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(99)
        lengths = torch.randint(1, 10, (N,), generator=g)
        self.tokens = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in lengths]
        self.labels = torch.randint(0, 2, (N,), generator=g)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tokens": self.tokens[i], "label": self.labels[i]}


def pad(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of these samples (token 0 is padding)."""
    tokens = nn.utils.rnn.pad_sequence([s["tokens"] for s in samples], batch_first=True)
    return {"tokens": tokens, "label": torch.stack([s["label"] for s in samples])}


class WithCollateFn(Sequences):
    """The same data, carrying its own collate as many datasets do."""

    collate_fn = staticmethod(pad)


class MeanOfTokens(nn.Module):
    """Mean of the embeddings of the real tokens: the padding does not change the output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.head = nn.Linear(8, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        return self.head((self.embed(tokens) * mask).sum(1) / mask.sum(1))


def optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5)


def loss(out: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(out, batch["label"])


def make_task(own_collate_fn: bool) -> tandem.Task:
    return tandem.Task(
        model=MeanOfTokens, optimizer=optimizer, loss=loss,
        train_data=WithCollateFn if own_collate_fn else Sequences,
        eval_data=WithCollateFn if own_collate_fn else Sequences,
        collate=None if own_collate_fn else pad,
        forward=lambda model, batch: model(batch["tokens"]),
        metrics={"accuracy": lambda out, b: (out.argmax(1) == b["label"]).float().mean()})


def _train(rank: int, world: int, out: str, own_collate_fn: bool, micro: int,
           in_memory: bool) -> None:
    cfg = tandem.Config()
    cfg.run.dir, cfg.run.name, cfg.run.seed = out, "collate", SEED
    cfg.train.steps, cfg.train.global_batch, cfg.train.micro_batch = STEPS, GLOBAL, micro
    cfg.train.eval_batch = 7
    cfg.monitor.progress, cfg.monitor.calibrate_at, cfg.monitor.report = "off", 0, False
    cfg.checkpoint.at_end = False
    cfg.data.in_memory = in_memory
    result = tandem.fit(make_task(own_collate_fn), config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))
        torch.save(torch.tensor(result.summary["eval_loss"]), Path(out, "eval_loss.pt"))


def reference() -> tuple[nn.Module, float]:
    """One process, plain PyTorch: the global order, each global batch padded as one."""
    torch.manual_seed(derive_seed("build", SEED))
    data = Sequences()
    model = MeanOfTokens()
    opt = optimizer(model.parameters())
    for ids in global_batches(STEPS, GLOBAL, SEED, N):
        batch = pad([data[i] for i in ids.tolist()])
        opt.zero_grad()
        loss(model(batch["tokens"]), batch).backward()
        opt.step()
    with torch.no_grad():
        whole = pad([data[i] for i in range(N)])
        eval_loss = float(loss(model(whole["tokens"]), whole))
    return model, eval_loss


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("world", "own_collate_fn", "micro", "in_memory"),
                         [(1, False, 0, False), (1, True, 4, True), (2, False, 3, False),
                          (2, True, 0, False), (2, False, 0, True)])
def test_custom_collate_trains_as_plain_pytorch(tmp_path: Path, world: int,
                                                own_collate_fn: bool, micro: int,
                                                in_memory: bool) -> None:
    run_ranks(_train, world, str(tmp_path), own_collate_fn, micro, in_memory, timeout=120)
    ref, ref_eval = reference()
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # Evaluation batches (7 samples, padded to their own longest) score every sample once.
    got_eval = float(torch.load(tmp_path / "eval_loss.pt", weights_only=True))
    assert got_eval == pytest.approx(ref_eval, rel=1e-5)
