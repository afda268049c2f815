"""Mixtures of sources: shares against independently computed proportions, the sequence
at any world size and across a resume, each source's loss and evaluation, bad input."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset

import tandem
from tandem.analyze.diagnosis.diagnose import diagnose
from tandem.analyze.report.run_report import write_html
from tandem.config import validate
from tandem.data.mixture import MixedBatch
from tandem.data.sampler import Cursor, GlobalBatchSampler
from tandem.monitor.store import RunStore
from tandem.trainer.data import build_data
from tandem.trainer.resume_rules import guarded_changes
from tests.dist import mix_task

SIZES = [300, 5000, 1200]


class Ids(Dataset):
    """Item i is i (cheap: the order is what is tested)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _mixture(weights=(None, None, None), temperature=None, sizes=SIZES) -> tandem.Mixture:
    return tandem.Mixture([tandem.Source(name=f"s{k}", train=lambda n=n: Ids(n),
                                         loss=lambda o, b: o.sum(), weight=w)
                           for k, (n, w) in enumerate(zip(sizes, weights, strict=True))],
                          temperature=temperature)


def _stream(data, world: int, accum: int, steps: int, g: int = 100,
            cursor: Cursor | None = None) -> list[list[int]]:
    """The global batches `world` ranks train on, rebuilt from their micro-batches."""
    iters = [iter(GlobalBatchSampler(dataset_len=len(data), global_batch=g, accum=accum,
                                     rank=r, world_size=world, seed=9,
                                     cursor=cursor or Cursor(), order=data.epoch_order))
             for r in range(world)]
    out = []
    for _ in range(steps):
        batch: list[int] = []
        for it in iters:
            for _ in range(accum):
                batch += next(it)
        out.append(batch)
    return out


def _source_of(code: int) -> int:
    """Which source an item number belongs to: the sources sit side by side."""
    edge = 0
    for k, n in enumerate(SIZES):
        edge += n
        if code < edge:
            return k
    raise AssertionError(code)


@pytest.mark.parametrize(("weights", "temperature", "expected"), [
    ((3.0, 1.0, 1.0), None, [0.6, 0.2, 0.2]),
    ((None, None, None), 2.0, [math.sqrt(n) / sum(math.sqrt(m) for m in SIZES)
                               for n in SIZES]),
    ((None, None, None), None, [n / sum(SIZES) for n in SIZES]),
])
def test_shares_are_within_one_point_over_10k_samples(weights, temperature,
                                                      expected) -> None:
    data = _mixture(weights, temperature).train()
    # From sample 3500 on: 10k samples across the boundary of the mixture's epoch (6500).
    cursor = Cursor(epoch=0, offset=3500)
    codes = sum(_stream(data, 1, 1, 100, cursor=cursor), [])
    assert len(codes) == 10_000
    counts = [0, 0, 0]
    for code in codes:
        counts[_source_of(code)] += 1
    for k, p in enumerate(expected):
        assert abs(counts[k] / 10_000 - p) < 0.01, (k, counts, expected)
    for start in range(0, 10_000, 1000):  # and in every stretch of 1000
        window = [_source_of(c) for c in codes[start:start + 1000]]
        for k, p in enumerate(expected):
            assert abs(window.count(k) / 1000 - p) < 0.01, (start, k)


def test_a_source_draws_each_sample_once_before_any_repeats() -> None:
    data = _mixture((3.0, 1.0, 1.0)).train()  # s0: 300 samples, 3900 draws an epoch
    drawn = [c for e in range(2) for c in data.epoch_order(9, e).tolist() if c < SIZES[0]]
    assert len(drawn) == 2 * 3900
    for start in range(0, len(drawn) - 300, 300):
        assert sorted(drawn[start:start + 300]) == list(range(300))
    # A source of 3 samples with half the stream walks 34 of its epochs in each of ours.
    tiny = _mixture((1.0, 1.0, 1.0), sizes=[3, 200, 7]).train()
    drawn = [c for e in range(3) for c in tiny.epoch_order(9, e).tolist() if c < 3]
    assert len(drawn) == 3 * 70
    assert all(sorted(drawn[i:i + 3]) == [0, 1, 2] for i in range(0, len(drawn), 3))


def test_the_sequence_is_the_same_at_any_world_size_and_after_a_resume() -> None:
    data = _mixture((3.0, 1.0, 1.0)).train()
    full = _stream(data, 1, 1, 140)  # past the epoch boundary (65 steps an epoch)
    assert _stream(data, 2, 1, 140) == full
    assert _stream(data, 4, 5, 140) == full
    cursor = Cursor()
    for _ in range(70):
        cursor.take(100, len(data))
    resumed = _stream(data, 2, 1, 70, cursor=Cursor.from_state(cursor.state_dict()))
    assert resumed == full[70:]
    assert data.epoch_order(9, 1).tolist() != data.epoch_order(9, 0).tolist()
    assert data.epoch_order(10, 0).tolist() != data.epoch_order(9, 0).tolist()


def test_the_loss_is_the_mean_over_samples_of_each_sources_loss() -> None:
    mix = mix_task.mixture()
    data = mix.train()
    samples = [data[i] for i in (0, 95, 3, 100, 1, 139)]  # cls 0, 3, 1; reg 5, 10, 49
    batch = data.collate_fn(samples)
    assert isinstance(batch, MixedBatch) and batch.source.tolist() == [0, 0, 0, 1, 1, 1]
    torch.manual_seed(0)
    model = mix_task.TwoHeads()
    got = mix.loss(model(batch.input), batch)
    cls, reg = data.datasets
    c_ids, r_ids = [0, 3, 1], [5, 10, 49]
    want = (F.cross_entropy(model(cls.x[c_ids])["cls"], cls.y[c_ids]) * 3
            + F.mse_loss(model(reg.x[r_ids])["reg"], reg.y[r_ids]) * 3) / 6
    torch.testing.assert_close(got, want)
    # A batch of one source still gives the other head a (zero) gradient.
    only = data.collate_fn([data[0], data[1]])
    mix.loss(model(only.input), only).backward()
    assert model.reg.weight.grad is not None and not model.reg.weight.grad.any()


def test_a_run_records_each_sources_loss_and_evaluates_each_source(tmp_path: Path) -> None:
    mix_task.SEEN.clear()
    cfg = mix_task.config(str(tmp_path), 12, 20, monitor={"log_every": 6},
                          train={"target": "task/reg/eval_loss<=1e9"})
    result = tandem.fit(mix_task.task(), config=cfg)
    # A source's own figure is a goal evaluation checks.
    assert result.summary["target"] == "task/reg/eval_loss<=1e9 at step 12"
    ref, per_step = mix_task.reference(5, 12, 20)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(result.model.state_dict()[name], value, rtol=1e-5,
                                   atol=1e-6)
    trained = mix_task.stream(5, 12, 20)
    assert sorted(mix_task.SEEN) == sorted(s for batch in trained for s in batch)
    (store_file,) = tmp_path.rglob("*.db")
    with RunStore(store_file) as store:
        (run,) = store.runs()
        rows = store.metrics(run["run_id"])
        page = write_html(store, run["run_id"], tmp_path / "report.html").read_text()
    # The report's per-task chart holds each source's recorded curves.
    block = re.search(r'<script type="application/json" id="data-task-loss">(.*?)</script>',
                      page, re.S)
    assert block is not None
    series = {line["name"]: line["y"] for line in json.loads(block.group(1))["series"]}
    assert series["cls loss"] == [r["value"] for r in rows if r["name"] == "task/cls/loss"]
    assert set(series) == {"cls loss", "reg loss", "cls eval_loss", "reg eval_loss"}
    last = {r["name"]: r["value"] for r in rows if r["rank"] == -1 and r["step"] == 12}
    # The last window (steps 6-11): each source's mean loss over its samples and share.
    for name in ("cls", "reg"):
        seen = [step[name] for step in per_step[6:] if name in step]
        count = sum(n for _, n in seen)
        assert last[f"task/{name}/loss"] == pytest.approx(
            sum(v * n for v, n in seen) / count, rel=1e-5)
        assert last[f"task/{name}/share"] == pytest.approx(count / 120)
    model = result.model.eval()
    with torch.no_grad():
        cls, reg = mix_task.Indexed("cls", 30, True), mix_task.Indexed("reg", 20, True)
        out_c, out_r = model(cls.x)["cls"], model(reg.x)["reg"]
        want = {"task/cls/eval_loss": F.cross_entropy(out_c, cls.y).item(),
                "task/reg/eval_loss": F.mse_loss(out_r, reg.y).item(),
                "task/cls/accuracy": (out_c.argmax(-1) == cls.y).float().mean().item()}
    want["eval_loss"] = (want["task/cls/eval_loss"] * 30 + want["task/reg/eval_loss"] * 20) / 50
    for name, value in want.items():
        assert last[name] == pytest.approx(value, rel=1e-5), name


@pytest.mark.parametrize(("make", "message"), [
    (lambda: _mixture((1.0, 0.0, 1.0)), r"weight 0.0 must be a finite number > 0"),
    (lambda: _mixture((1.0, -2.0, 1.0)), r"weight -2.0 must be a finite number > 0"),
    (lambda: _mixture(temperature=0.0), r"temperature 0.0 must be a finite number > 0"),
    (lambda: _mixture(temperature=-1), r"temperature -1 must be a finite number > 0"),
    (lambda: _mixture((1.0, None, 1.0)), r"sources \['s1'\] have no weight"),
    (lambda: _mixture((1.0, 1.0, 1.0), temperature=2.0), r"either a temperature or"),
    (lambda: _mixture(sizes=[10, 0, 5]).train(), r"'s1': train\(\) returned an empty"),
    (lambda: _mixture().reweighted({"s0": 1, "s1": 1, "s9": 2}),
     r"no source is called 's9'; the sources are \['s0', 's1', 's2'\]"),
    (lambda: _mixture().reweighted({"s0": 1}), r"no weight for sources \['s1', 's2'\]"),
    (lambda: _mixture((1.0, 1.0, 1e-9)).train(), r"'s2' gets no sample of an epoch"),
    (lambda: tandem.Mixture([]), r"at least one"),
    (lambda: tandem.Source(name="a/b", train=lambda: Ids(2), loss=sum), r"without '/'"),
])
def test_bad_mixtures_are_refused_with_what_is_allowed(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def _task_rows(curves: dict[str, list[float]], what: str = "loss") -> list[dict]:
    return [{"step": 10 * (i + 1), "rank": -1, "name": f"task/{source}/{what}", "value": v,
             "time": float(i)} for source, values in curves.items()
            for i, v in enumerate(values)]


def test_the_diagnosis_names_a_task_whose_loss_stalls_or_rises_while_others_fall() -> None:
    falling = [2.0, 1.8, 1.5, 1.3, 1.1, 1.0, 0.9, 0.85, 0.8, 0.75]  # -44%
    flat = [0.7, 0.69, 0.71, 0.7, 0.7, 0.69, 0.7, 0.7, 0.71, 0.7]  # 0.7 -> 0.7
    rising = [0.5, 0.5, 0.52, 0.55, 0.6, 0.62, 0.65, 0.66, 0.7, 0.72]  # medians 0.5 -> 0.7
    found = [f for f in diagnose(_task_rows({"a": falling, "b": flat, "c": rising}))
             if f.kind == "task-stalls"]
    by_task = {f.evidence["task"]: f for f in found}
    assert set(by_task) == {"b", "c"}
    assert by_task["c"].severity == "medium" and "rose" in by_task["c"].message
    assert by_task["b"].severity == "low" and "stalled" in by_task["b"].message
    assert by_task["c"].evidence["change"] == pytest.approx(0.70 / 0.50 - 1)
    assert by_task["b"].evidence["others"] == {"a": pytest.approx(0.8 / 1.8 - 1)}
    # All falling, or too few windows to tell: nothing to say.
    assert not [f for f in diagnose(_task_rows({"a": falling, "b": falling}))
                if f.kind == "task-stalls"]
    assert not [f for f in diagnose(_task_rows({"a": falling[:5], "b": flat[:5]}))
                if f.kind == "task-stalls"]
    # A source starved to a few samples learns them by heart: its training loss falls
    # with the others' while its evaluation loss rises; the evaluation names it.
    rows = (_task_rows({"a": falling, "b": falling}) + _task_rows({"a": falling,
            "b": rising}, "eval_loss") + _task_rows({"a": [0.99] * 10, "b": [0.01] * 10},
                                                    "share"))
    found = [f for f in diagnose(rows) if f.kind == "task-stalls"]
    assert [(f.evidence["task"], f.evidence["figure"]) for f in found] == [
        ("b", "evaluation loss")]
    assert "its evaluation loss rose (+40%" in found[0].message
    assert found[0].evidence["shares"] == {"a": 0.99, "b": 0.01}


def test_data_mix_sets_the_shares_from_the_config_and_a_resume_guards_it(
        tmp_path: Path) -> None:
    cfg = mix_task.config(str(tmp_path), 10, 20, data={"mix": "cls=1,reg=1"})
    data = build_data(mix_task.task(), validate(cfg), 1)
    codes = data.order(5, 0).tolist()
    counts = [sum(1 for c in codes if c < 90), sum(1 for c in codes if c >= 90)]
    assert counts == [70, 70]  # half of the 140 positions each, not the script's 1:3
    cfg.data.mix = "temperature=1"  # by size: 90 and 50
    codes = build_data(mix_task.task(), validate(cfg), 1).order(5, 0).tolist()
    assert sum(1 for c in codes if c < 90) == 90
    cfg.data.mix = "cls=1,rgr=1"
    with pytest.raises(ValueError, match=r"data.mix: .*no source is called 'rgr'; the "
                                         r"sources are \['cls', 'reg'\]"):
        build_data(mix_task.task(), cfg, 1)
    plain = tandem.Task(model=mix_task.TwoHeads, optimizer=mix_task.make_optimizer,
                        train_data=lambda: Ids(40), loss=lambda o, b: o.sum())
    with pytest.raises(ValueError, match="data.mix: 'cls=1,rgr=1' sets the shares of a "
                                         "tandem.Mixture; this task's train_data is a Ids"):
        build_data(plain, cfg, 1)
    assert guarded_changes({"data": {"mix": ""}}, {"data": {"mix": "cls=1,reg=1"}}) == [
        ("data.mix", "", "cls=1,reg=1")]


@pytest.mark.parametrize(("mix", "message"), [
    ("cls=0", r"'cls=0' is not NAME=NUMBER with a finite number > 0"),
    ("cls=-1,reg=1", r"'cls=-1' is not NAME=NUMBER"),
    ("cls", r"'cls' is not NAME=NUMBER"),
    ("cls=1,cls=2", r"'cls' is given twice"),
    ("temperature=0", r"'temperature=0' is not NAME=NUMBER with a finite number > 0"),
])
def test_bad_data_mix_values_are_refused(mix: str, message: str) -> None:
    cfg = tandem.Config()
    cfg.data.mix = mix
    with pytest.raises(ValueError, match=f"data.mix: {message}"):
        validate(cfg)
