"""Data x tensor parallel (plan.tp) trains what one plain PyTorch process trains.

4 ranks as a 2 x 2 mesh and 2 ranks as pure tensor parallelism run `tandem.fit` on the
char-LM example's transformer (small); the reference is a plain single-process loop over
the same global batches. A 2 x 2 checkpoint also resumes on one process.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

import tandem
from tandem.data.sampler import epoch_order
from tandem.monitor.store import RunStore
from tandem.runtime import derive_seed
from tests.dist.procs import run_ranks
from tests.dist.token_data import Tokens, adamw, char_lm_task
from tests.dist.toy_task import global_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import char_lm  # noqa: E402

N, T, GLOBAL, SEED, CLIP = 96, 16, 8, 3, 1.0


def task() -> tandem.Task:
    return char_lm_task(99, N, T, dim=32, layers=2, heads=4, evaluate=True,
                        tensor_parallel=True)


def _fit(rank: int, world: int, out: str, tp: int, steps: int, micro: int) -> None:
    argv = ["--run.dir", out, "--run.name", f"tp{tp}w{world}", "--run.seed", str(SEED),
            "--train.steps", str(steps), "--train.global_batch", str(GLOBAL),
            "--train.micro_batch", str(micro), "--train.grad_clip", str(CLIP),
            "--plan.tp", str(tp), "--monitor.progress", "off", "--monitor.log_every", "2",
            "--checkpoint.at_end", "true"]
    result = tandem.fit(task(), argv=argv)
    if rank == 0:
        torch.save({"state": result.model.state_dict(), "summary": result.summary},
                   Path(out, f"tp{tp}w{world}.pt"))


def reference(steps: int) -> tuple[dict[str, torch.Tensor], float]:
    """One process, plain PyTorch: the documented order, the whole global batch per step."""
    torch.manual_seed(derive_seed("build", SEED))
    data = Tokens(N, T, 99)
    model = task().model()
    opt = adamw(model.parameters())
    for ids in global_batches(steps, GLOBAL, SEED, N):
        opt.zero_grad()
        char_lm.loss(model(data.x[ids, :-1]), (None, data.x[ids, 1:])).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    with torch.no_grad():
        eval_loss = float(F.cross_entropy(model(data.x[:, :-1]).flatten(0, 1),
                                          data.x[:, 1:].flatten()))
    return model.state_dict(), eval_loss


def _assert_matches(got: dict, steps: int) -> None:
    want, eval_loss = reference(steps)
    assert sorted(got["state"]) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got["state"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert got["summary"]["eval_loss"] == pytest.approx(eval_loss, rel=1e-4)


@pytest.mark.timeout(230)  # its two runs' own timeouts, and a margin
def test_2x2_data_by_tensor_parallel_matches_one_process(tmp_path: Path) -> None:
    # Accumulation too: 8 samples / 2 data-parallel ranks = 4, in micro-batches of 2.
    run_ranks(_fit, 4, str(tmp_path), 2, 6, 2, timeout=140)
    got = torch.load(tmp_path / "tp2w4.pt", weights_only=False)
    with RunStore(tmp_path / "tandem.db") as store:
        plan = store.run("tp2w4")["plan"]
    assert (plan["strategy"], plan["data_parallel"], plan["tensor_parallel"]) == ("tp", 2, 2)
    assert plan["accumulation"] == 2
    _assert_matches(got, 6)
    # The 2 x 2 checkpoint (DTensor shards) resumes on one plain process: the run
    # directory is renamed to the one-process run's name, which then continues to step 9.
    (tmp_path / "tp2w4").rename(tmp_path / "tp1w1")
    run_ranks(_fit, 1, str(tmp_path), 1, 9, 0, timeout=60)
    got = torch.load(tmp_path / "tp1w1.pt", weights_only=False)
    assert got["summary"]["steps"] == 9
    _assert_matches(got, 9)


@pytest.mark.timeout(120)
def test_pure_tensor_parallel_matches_one_process(tmp_path: Path) -> None:
    run_ranks(_fit, 2, str(tmp_path), 2, 5, 0, timeout=110)
    _assert_matches(torch.load(tmp_path / "tp2w2.pt", weights_only=False), 5)
