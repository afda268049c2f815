"""Metrics reduced across ranks equal one process's metrics on the whole set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tandem.config import Config
from tandem.runtime import start, stop
from tandem.task import Task
from tandem.trainer.evaluate import evaluate
from tandem.trainer.precision import Precision
from tests.dist.procs import run_ranks

N = 203  # not divisible by 2, 3 or 4: shards and last batches are uneven


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(N, 6, generator=g), torch.randint(0, 3, (N,), generator=g))


def _model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Linear(6, 3)


def _task() -> Task:
    return Task(model=_model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), train_data=_data,
                loss=lambda out, b: nn.functional.cross_entropy(out, b[1]),
                metrics={"accuracy": lambda out, b: (out.argmax(1) == b[1]).float().mean()})


def _evaluate(rank: int, world: int, out: str) -> None:
    cfg = Config()
    runtime = start(cfg.plan)
    try:
        values = evaluate(_task(), _model(), _data(), runtime, 16, cfg.data,
                          Precision(cfg.precision, runtime.device))
    finally:
        stop(runtime)
    Path(out, f"eval{rank}.json").write_text(json.dumps(values))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 3])
def test_sharded_metrics_equal_whole_set_metrics(tmp_path: Path, world: int) -> None:
    run_ranks(_evaluate, world, str(tmp_path), timeout=100)
    x, y = _data().tensors
    with torch.no_grad():
        out = _model()(x)
    want_acc = (out.argmax(1) == y).float().mean().item()
    want_loss = nn.functional.cross_entropy(out, y).item()
    for rank in range(world):
        got = json.loads((tmp_path / f"eval{rank}.json").read_text())
        assert got["accuracy"] == pytest.approx(want_acc, abs=1e-9)
        assert got["loss"] == pytest.approx(want_loss, rel=1e-6)
