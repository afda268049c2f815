"""The peer comparison's shared recipe and clock (benchmarks/peers): pure logic, no processes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))

import figures as fg  # noqa: E402
import recipe as rc  # noqa: E402

from tandem.config import OptimConfig  # noqa: E402
from tandem.optim.schedule import lr_multiplier  # noqa: E402


@pytest.mark.parametrize("task", ["mnist1d", "char_lm"])
def test_schedule_is_tandems(task: str) -> None:
    r = rc.recipe(task)
    cfg = OptimConfig(schedule="warmup_cosine", warmup_steps=r.warmup,
                      min_lr_ratio=r.min_lr_ratio)
    for step in (0, 1, r.warmup - 1, r.warmup, r.warmup + 1, r.steps // 2, r.steps - 1):
        assert r.lr_multiplier(step) == pytest.approx(lr_multiplier(cfg, step, r.steps))


def test_paper_recipe_is_constant_and_its_cnn_has_the_papers_shape() -> None:
    r = rc.recipe("mnist1d_paper")
    assert {r.lr_multiplier(s) for s in (0, 10, 5999)} == {1.0}
    model = rc.ConvBase()
    assert model(torch.zeros(3, 1, 40)).shape == (3, 10)
    assert model.linear.in_features == 125  # 25 channels x 5 positions, as in the paper


def test_steps_override_keeps_the_rest() -> None:
    r = rc.recipe("mnist1d", steps=200)
    assert (r.steps, r.global_batch, r.warmup) == (200, 128, 50)
    assert r.evaluates_at(25) and r.evaluates_at(200) and not r.evaluates_at(30)


def test_per_sample_sums_give_the_batch_means() -> None:
    torch.manual_seed(0)
    logits, y = torch.randn(6, 10), torch.randint(0, 10, (6,))
    totals = rc.sums(rc.per_sample(logits, (logits, y)))
    got = rc.means(["accuracy", "loss"], totals)
    assert got["loss"] == pytest.approx(float(rc.loss(logits, (logits, y))), rel=1e-6)
    assert got["accuracy"] == pytest.approx(float(rc.accuracy(logits, (logits, y))))
    seq_logits, seq_y = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    totals = rc.sums(rc.per_sample(seq_logits, (seq_logits, seq_y)))
    assert rc.means(["loss"], totals)["loss"] == pytest.approx(
        float(rc.loss(seq_logits, (seq_logits, seq_y))), rel=1e-6)


def test_fetch_log_sees_training_start_and_each_evaluation() -> None:
    log = rc.FetchLog()
    for kind in ["train"] * 3 + ["eval"] * 2 + ["train"] * 2 + ["eval"]:
        log.fetch(kind)
    clock = log.to_dict()
    assert log.t0 is not None and clock["t0_epoch"] is not None
    assert len(clock["eval_starts_s"]) == 2 and len(clock["resumes_s"]) == 1
    assert 0 <= clock["eval_starts_s"][0] <= clock["resumes_s"][0] <= clock["eval_starts_s"][1]


def _rank(evals: list[dict[str, float]], starts: list[float], resumes: list[float],
          rank: int = 0) -> dict:
    return {"rank": rank, "t0_epoch": 110.0, "process_start_epoch": 102.0, "end_epoch": 150.0,
            "max_rss_mib": 400.0 + rank, "evals": evals, "eval_starts_s": starts,
            "resumes_s": resumes}


def test_figures_time_to_target_throughput_and_startup() -> None:
    r = rc.recipe("mnist1d", steps=75)
    evals = [{"step": 25, "accuracy": 0.90}, {"step": 50, "accuracy": 0.95},
             {"step": 75, "accuracy": 0.97}]
    ranks = [_rank(evals, [10.0, 21.0, 32.0], [11.0, 22.0]), _rank([], [], [], 1)]
    f = fg.run_figures(r, ranks, launch_epoch=100.0, exit_epoch=152.0)
    assert f["targets"]["94%"] == {"s": 21.0, "train_only_s": 20.0, "step": 50}
    assert f["targets"]["99%"] is None
    assert f["train_s"] == 30.0 and f["samples_per_s"] == pytest.approx(75 * 128 / 30.0)
    assert (f["startup_s"], f["launcher_s"], f["teardown_s"]) == (10.0, 2.0, 2.0)
    assert f["peak_rss_mib"] == 401.0 and f["best_accuracy"] == 0.97


def test_figures_refuse_a_run_that_stopped_early() -> None:
    r = rc.recipe("mnist1d", steps=75)
    ranks = [_rank([{"step": 25, "accuracy": 0.5}], [10.0], [])]
    with pytest.raises(ValueError, match="not 75"):
        fg.run_figures(r, ranks, 100.0, 150.0)


def test_spread_and_ratio() -> None:
    s = fg.spread([3.0, None, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "missing": 1}
    assert fg.fmt_spread(s) == "2.0 [1.0-3.0] (3/4)"
    assert fg.fmt_spread(None) == "not reached"
    assert fg.ratio(fg.spread([4.0]), fg.spread([2.0])) == "2.00"
    assert fg.spread([math.nan]) is None


def test_targets_compare_at_six_decimals() -> None:
    target = rc.Target("accuracy", ">=", 0.94)
    assert target.met({"accuracy": float(torch.tensor(470 / 500, dtype=torch.float32))})
    assert not target.met({"accuracy": 0.939})
    assert rc.Target("loss", "<=", 2.3).met({"loss": 2.3000000001})


def test_muon_recipe_is_the_examples_default() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import mnist1d_cnn

    r = rc.recipe("mnist1d_muon")
    example = mnist1d_cnn.RECIPE
    assert (r.steps, r.global_batch, r.eval_every, r.eval_batch, r.warmup, r.ema_decay) == (
        example["train.steps"], example["train.global_batch"], example["train.eval_every"],
        example["train.eval_batch"], example["optim.warmup_steps"], example["train.ema_decay"])
    assert r.schedule == example["optim.schedule"]
    assert r.optimizer is mnist1d_cnn.task.optimizer
    with pytest.raises(SystemExit, match="does not implement"):
        rc.plain(r, "accelerate_loop.py")


def test_char_lm_muon_recipe_is_the_examples_default() -> None:
    lm = rc.char_lm_module()
    r = rc.recipe("char_lm_muon")
    example = lm.RECIPE
    assert (r.steps, r.global_batch, r.warmup, r.min_lr_ratio, r.grad_clip, r.precision) == (
        example["train.steps"], example["train.global_batch"], example["optim.warmup_steps"],
        example["optim.min_lr_ratio"], example["train.grad_clip"], example["precision.mode"])
    assert r.schedule == example["optim.schedule"]
    assert r.optimizer is lm.muon is lm.OPTIMIZERS["muon"]
    with r.autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.bfloat16
    with rc.recipe("char_lm").autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float32
    with pytest.raises(SystemExit, match="trains in bf16 autocast"):
        rc.plain(r, "lightning_fit.py")


def test_hand_written_average_is_tandems() -> None:
    import ddp_loop

    from tandem.components.ema import WeightAverage

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    ours = [p.detach().clone() for p in params]
    theirs = WeightAverage(model, 0.9)
    for n in range(15):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p))
        ddp_loop.update_average(ours, params, 0.9, n)
        theirs.update()
    for mine, ref in zip(ours, theirs.average.values(), strict=True):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-6)
