"""Training-speed options against independent computations (one process, plain PyTorch):
weight averaging, label smoothing, test-time views, sequence ramp, schedules, in-memory
batches, evaluation cadence."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, default_collate

import tandem
from tandem.components.ema import decay_at
from tandem.config import OptimConfig, load
from tandem.data.memory import MemoryDataset
from tandem.data.seqlen import SeqRamp, cut
from tandem.errors import UsageError
from tandem.optim.schedule import lr_multiplier
from tandem.runtime import derive_seed
from tests.dist.toy_task import global_batches

N, DIM, CLASSES = 96, 8, 4


class Blobs(Dataset):
    """Fixed random inputs with labels from a fixed random linear map."""

    def __init__(self, offset: int = 0) -> None:
        g = torch.Generator().manual_seed(99 + offset)
        self.x = torch.randn(N, DIM, generator=g)
        self.y = (self.x @ torch.randn(DIM, CLASSES, generator=g)).argmax(1)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 16), nn.Tanh(), nn.Linear(16, CLASSES))


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


def accuracy(out: torch.Tensor, batch) -> torch.Tensor:
    return (out.argmax(1) == batch[1]).float().mean()


def task(**extra) -> tandem.Task:
    fields = {"model": make_model, "optimizer": make_optimizer, "train_data": Blobs,
              "eval_data": lambda: Blobs(1), "loss": tandem.CrossEntropy(),
              "metrics": {"accuracy": accuracy}}
    return tandem.Task(**{**fields, **extra})


def config(tmp: Path, steps: int, name: str = "run", **flat) -> tandem.Config:
    values = {"run.dir": str(tmp), "run.name": name, "run.seed": 3, "train.steps": steps,
              "train.global_batch": 16, "monitor.progress": "off", "monitor.report": False,
              "monitor.calibrate_at": 0, "checkpoint.async_save": False, **flat}
    return load(overrides=values)


def hand_run(steps: int, smoothing: float = 0.0, decay: float = 0.0,
             seed: int = 3) -> tuple[nn.Module, nn.Module | None]:
    """Plain PyTorch: the documented global order, the same model, SGD, the average."""
    torch.manual_seed(derive_seed("build", seed))
    data = Blobs()
    model = make_model()
    opt = make_optimizer(model.parameters())
    average = [p.detach().clone() for p in model.parameters()]
    for step, ids in enumerate(global_batches(steps, 16, seed, N)):
        opt.zero_grad()
        F.cross_entropy(model(data.x[ids]), data.y[ids], label_smoothing=smoothing).backward()
        opt.step()
        d = min(decay, (1 + step) / (10 + step))
        for a, p in zip(average, model.parameters(), strict=True):
            a.copy_(d * a + (1 - d) * p.detach())
    if not decay:
        return model, None
    averaged = make_model()
    with torch.no_grad():
        for q, a in zip(averaged.parameters(), average, strict=True):
            q.copy_(a)
    return model, averaged


def assert_same_weights(got: nn.Module, want: nn.Module) -> None:
    for (name, a), b in zip(got.state_dict().items(), want.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def plain_eval(model: nn.Module) -> tuple[float, float]:
    data = Blobs(1)
    with torch.no_grad():
        out = model(data.x)
    return F.cross_entropy(out, data.y).item(), (out.argmax(1) == data.y).float().mean().item()


# ----------------------------------------------------------------- weight averaging
def test_decay_warms_up_then_holds() -> None:
    assert decay_at(0.99, 0) == pytest.approx(0.1)
    assert decay_at(0.99, 10) == pytest.approx(11 / 20)
    assert decay_at(0.99, 10_000) == 0.99


def test_average_is_evaluated_returned_and_resumed(tmp_path: Path) -> None:
    trained, want = hand_run(14, decay=0.9)
    # 8 steps, then the same run continued to 14 from its checkpoint.
    tandem.fit(task(), config=config(tmp_path, 8, **{"train.ema_decay": 0.9}))
    result = tandem.fit(task(), config=config(tmp_path, 14, **{"train.ema_decay": 0.9}))
    assert_same_weights(result.model, want)  # the returned model is the average
    loss, acc = plain_eval(want)
    assert result.summary["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert result.summary["accuracy"] == pytest.approx(acc, abs=1e-6)
    assert plain_eval(trained) != plain_eval(want)  # averaging changed what was scored
    manifests = sorted((tmp_path / "run" / "checkpoints").glob("step_*/manifest.json"))
    assert "ema" in json.loads(manifests[-1].read_text())["meta"]["states"]


def test_average_switched_on_at_resume_starts_from_the_weights(tmp_path: Path) -> None:
    tandem.fit(task(), config=config(tmp_path, 5))
    result = tandem.fit(task(), config=config(tmp_path, 6, **{"train.ema_decay": 0.5}))
    trained, _ = hand_run(6)
    five, _ = hand_run(5)
    d = decay_at(0.5, 0)  # one update after the reset to the step-5 weights
    for q, a, b in zip(result.model.parameters(), five.parameters(), trained.parameters(),
                       strict=True):
        torch.testing.assert_close(q, d * a + (1 - d) * b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- label smoothing
def test_label_smoothing_trains_smoothed_and_evaluates_plain(tmp_path: Path) -> None:
    result = tandem.fit(task(), config=config(tmp_path, 9, **{"train.label_smoothing": 0.2}))
    want, _ = hand_run(9, smoothing=0.2)
    assert_same_weights(result.model, want)
    assert result.summary["eval_loss"] == pytest.approx(plain_eval(want)[0], rel=1e-5)
    unsmoothed, _ = hand_run(9)
    assert plain_eval(unsmoothed)[0] != pytest.approx(plain_eval(want)[0], rel=1e-5)


def test_cross_entropy_is_torchs_over_every_position() -> None:
    logits, target = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    got = tandem.CrossEntropy(0.1)(logits, (None, target))
    want = F.cross_entropy(logits.permute(0, 2, 1), target, label_smoothing=0.1)
    torch.testing.assert_close(got, want)


def test_label_smoothing_needs_the_frameworks_loss(tmp_path: Path) -> None:
    own = task(loss=lambda out, batch: F.cross_entropy(out, batch[1]))
    with pytest.raises(UsageError, match="train.label_smoothing"):
        tandem.fit(own, config=config(tmp_path, 2, **{"train.label_smoothing": 0.1}))


# ----------------------------------------------------------------- test-time views
def views(batch):
    return [batch, (batch[0].flip(1), batch[1]), (batch[0] * 0.5, batch[1])]


def test_views_average_the_outputs(tmp_path: Path) -> None:
    result = tandem.fit(task(eval_views=views), config=config(tmp_path, 6, "tta"))
    model, data = result.model, Blobs(1)
    with torch.no_grad():
        out = (model(data.x) + model(data.x.flip(1)) + model(data.x * 0.5)) / 3
    assert result.summary["eval_loss"] == pytest.approx(F.cross_entropy(out, data.y).item(),
                                                         rel=1e-5)
    plain = tandem.fit(task(eval_views=views),
                       config=config(tmp_path, 6, "plain", **{"train.eval_views": False}))
    assert plain.summary["eval_loss"] == pytest.approx(plain_eval(model)[0], rel=1e-5)
    assert plain.summary["eval_loss"] != pytest.approx(result.summary["eval_loss"], rel=1e-4)


# ----------------------------------------------------------------- cadence, timing
def test_evaluations_start_at_eval_from_and_the_target_end_is_timed(tmp_path: Path) -> None:
    cfg = config(tmp_path, 12, **{"train.eval_every": 2, "train.eval_from": 7,
                                  "train.target": "accuracy>=0.0"})
    summary = tandem.fit(task(), config=cfg).summary
    with sqlite3.connect(tmp_path / "tandem.db") as db:
        steps = [s for (s,) in db.execute("SELECT DISTINCT step FROM metrics WHERE rank = -1 "
                                          "AND name = 'eval_loss' ORDER BY step")]
    assert steps == [8, 10, 12]
    assert summary["target"].endswith("at step 8")
    assert summary["time_to_target_s"] < summary["time_to_target_end_s"] <= summary[
        "wall_time_s"]


def test_stop_at_target_ends_the_run_there_and_a_rerun_is_complete(tmp_path: Path) -> None:
    cfg = config(tmp_path, 40, **{"train.eval_every": 4, "train.target": "accuracy>=0.0",
                                  "train.stop_at_target": True})
    summary = tandem.fit(task(), config=cfg).summary
    assert summary["steps"] == 4 and summary["target"].endswith("at step 4")
    want, _ = hand_run(4)
    assert summary["eval_loss"] == pytest.approx(plain_eval(want)[0], rel=1e-5)
    again = tandem.fit(task(), config=cfg)
    assert again.summary["steps"] == 4
    assert_same_weights(again.model, want)


# ----------------------------------------------------------------- schedules
def test_warmup_linear_and_wsd_by_hand() -> None:
    lin = OptimConfig(schedule="warmup_linear", warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_multiplier(lin, s, 24) for s in (0, 3)] == [0.25, 1.0]
    assert lr_multiplier(lin, 14, 24) == pytest.approx(1 - 0.9 * 10 / 20)
    assert lr_multiplier(lin, 24, 24) == pytest.approx(0.1)
    wsd = OptimConfig(schedule="wsd", warmup_steps=2, cooldown_frac=0.25, min_lr_ratio=0.0)
    got = [lr_multiplier(wsd, s, 20) for s in range(20)]
    want = [0.5, 1.0] + [1.0] * 13 + [1 - k / 5 for k in range(5)]
    assert got == pytest.approx(want)


# ----------------------------------------------------------------- sequence ramp
def test_seq_ramp_lengths_and_cut() -> None:
    ramp = SeqRamp("0:4,3:8,6:0")
    assert [ramp.length_at(s) for s in range(8)] == [4, 4, 4, 8, 8, 8, 0, 0]
    x, y, w = torch.arange(40).view(2, 20), torch.arange(40).view(2, 20) + 1, torch.ones(2)
    got = cut((x, {"y": y}, w), 5)
    assert torch.equal(got[0], x[:, :5]) and torch.equal(got[1]["y"], y[:, :5])
    assert torch.equal(got[2], w)
    for bad in ("4:8,10:0", "0:8,4:4,9:0", "0:8,4:16", "0:8,0:0"):
        with pytest.raises(ValueError, match="train.seq_ramp"):
            load(overrides={"train.seq_ramp": bad})


class Tokens(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = (torch.arange(17) + i) % 11
        return row[:-1], row[1:]


SEEN_LENGTHS: list[int] = []


def test_seq_ramp_trains_on_short_sequences_first(tmp_path: Path) -> None:
    def lm_loss(out, batch):
        if torch.is_grad_enabled():
            SEEN_LENGTHS.append(batch[0].shape[1])
        return F.cross_entropy(out.flatten(0, 1), batch[1].flatten())

    lm = tandem.Task(model=lambda: nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 11)),
                     optimizer=lambda p: torch.optim.SGD(p, lr=0.1), train_data=Tokens,
                     eval_data=Tokens, loss=lm_loss)
    SEEN_LENGTHS.clear()
    tandem.fit(lm, config=config(tmp_path, 7, **{"train.seq_ramp": "0:4,2:8,5:0"}))
    assert SEEN_LENGTHS == [4, 4, 8, 8, 8, 16, 16]


# ----------------------------------------------------------------- in-memory batches
class Mixed(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return torch.full((2, 3), float(i)), i, {"w": torch.tensor([i, -i])}, f"s{i}"


def test_memory_batches_equal_the_dataloaders_collation() -> None:
    data, held = Mixed(), MemoryDataset(Mixed())
    ids = [7, 2, 2, 9]
    got, want = held.gather(ids), default_collate([data[i] for i in ids])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1].dtype == want[1].dtype and torch.equal(got[2]["w"], want[2]["w"])
    assert got[3] == want[3]
    assert len(held) == 10 and held[4][3] == "s4" and torch.equal(held[4][0], data[4][0])


def test_welch_against_table_values() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from speedrun_stats import t_upper_tail, welch_less

    # Student t critical values (any printed table): one-sided 5% and 1%.
    for t, df, p in ((2.015, 5, 0.05), (3.365, 5, 0.01), (2.764, 10, 0.01), (1.812, 10, 0.05),
                     (2.457, 30, 0.01)):
        assert t_upper_tail(t, df) == pytest.approx(p, abs=2e-4)
    assert t_upper_tail(0.0, 7) == pytest.approx(0.5)
    new, old = [4.1, 4.3, 3.9, 4.2, 4.0], [5.0, 5.6, 4.8, 5.3, 5.1]
    mine = welch_less(new, old, use_scipy=False)
    va, vb = 0.025 / 5, 0.093 / 5  # sample variances over n
    assert mine.t == pytest.approx(1.06 / math.sqrt(va + vb))
    assert mine.df == pytest.approx((va + vb) ** 2 / (va**2 / 4 + vb**2 / 4))
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is not installed: the "
                                      "table values above are the check")
    ref = scipy_stats.ttest_ind(new, old, equal_var=False, alternative="less").pvalue
    assert mine.p == pytest.approx(ref, rel=1e-9)
    assert welch_less(old, new, use_scipy=False).p == pytest.approx(1 - ref, rel=1e-9)
