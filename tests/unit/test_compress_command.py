"""`tandem compress`: the choice against hand-made figures (the budget, the placebo, a budget
nothing meets), and one run end to end on a small classifier, its figures and the exported
program checked against independent computations."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tandem
from tandem.analyze.report.compression import newest
from tandem.cli import main
from tandem.compress.candidates import FineTune
from tandem.compress.experiment import ORIGINAL, Goal, choose, goal_of
from tandem.monitor.store import RunStore

SCRIPT = Path(__file__).resolve().parents[1] / "dist" / "scripts" / "compress_task.py"


def _row(metric: float, size: int, ms: float) -> dict:
    return {"metric": metric, "bytes": size, "latency_ms": {1: ms, 64: 10 * ms}}


ACCURACY, LOSS = Goal("accuracy", True), Goal("eval_loss", False)
ROWS = {ORIGINAL: _row(0.950, 1000, 1.0), "small": _row(0.945, 300, 1.0),
        "smaller": _row(0.930, 200, 0.5), "bigger": _row(0.960, 1200, 1.5)}


def test_the_smallest_model_within_the_budget_is_adopted() -> None:
    chosen, why, verdict = choose(ROWS, ACCURACY, 1.0, "size")
    assert chosen == "small" and verdict.startswith("small adopted")
    assert "2 worse" in why["smaller"] and "over the budget of 1" in why["smaller"]
    assert why["bigger"] == "neither smaller nor faster than the original"
    assert choose(ROWS, ACCURACY, 3.0, "size")[0] == "smaller"
    assert choose(ROWS, ACCURACY, 3.0, "speed")[0] == "smaller"


def test_over_seeds_the_worse_end_of_the_interval_must_be_within_the_budget() -> None:
    rows = {**ROWS, "small": {**ROWS["small"], "interval": [0.935, 0.955]}}
    chosen, why, _ = choose(rows, ACCURACY, 1.0, "size")
    assert chosen == ORIGINAL
    assert "0.945 (95% interval [0.935, 0.955]) is 1.5 worse" in why["small"]
    assert choose(rows, ACCURACY, 1.5, "size")[0] == "small"


def test_a_budget_no_candidate_meets_keeps_the_original_and_says_so() -> None:
    chosen, why, verdict = choose(ROWS, ACCURACY, 0.2, "size")
    assert chosen == ORIGINAL
    assert verdict == "no candidate meets the budget of 0.2: the original is kept"
    assert set(why) == {"small", "smaller", "bigger"}


def test_a_placebo_budget_keeps_the_original_unless_a_candidate_is_not_worse() -> None:
    assert choose(ROWS, ACCURACY, 0.0, "size")[0] == ORIGINAL
    rows = {**ROWS, "equal": _row(0.950, 500, 1.2)}
    assert choose(rows, ACCURACY, 0.0, "size")[0] == "equal"
    # a loss goes the other way, in its own units
    losses = {ORIGINAL: _row(1.00, 1000, 1.0), "a": _row(1.04, 400, 1.0),
              "b": _row(1.10, 100, 1.0)}
    assert choose(losses, LOSS, 0.05, "size")[0] == "a"
    assert choose(losses, LOSS, 0.0, "size")[0] == ORIGINAL


def test_the_metric_and_its_direction_come_from_the_target_or_the_name() -> None:
    task = tandem.Task(model=lambda: None, optimizer=lambda p: None, train_data=list,
                       loss=lambda o, b: o, metrics={"bits_per_byte": len, "accuracy": len})
    assert goal_of(task, None, "") == ACCURACY
    assert goal_of(task, None, "eval_loss<=2.3") == LOSS
    assert goal_of(task, "bits_per_byte", "") == Goal("bits_per_byte", False)
    assert goal_of(task, "accuracy", "accuracy<=0.5") == Goal("accuracy", False)
    with pytest.raises(ValueError, match=r"--metric 'bleu': the task's evaluation gives "
                                         r"\['bits_per_byte', 'accuracy', 'eval_loss'\]"):
        goal_of(task, "bleu", "")


def chosen_is_not(found: dict, name: str) -> bool:
    return found["chosen"]["technique"] != name and any(
        r["technique"] == name and r["why"].startswith("the control")
        for r in found["rejected"])


def test_a_fine_tune_with_the_original_as_teacher_is_a_plain_distillation_loop() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import compress_task

    torch.manual_seed(0)
    teacher, student = compress_task.make_model().eval(), compress_task.make_model()
    want = copy.deepcopy(student)
    tune = FineTune(compress_task.task, 3, 32, 0.5, 1, teacher=teacher, distill=0.7,
                    temperature=3.0)
    tune.run(student)
    opt = torch.optim.Adam(want.parameters(), lr=1e-2 * 0.5)
    for step, (x, y) in zip(range(3), tune.batches(), strict=False):
        opt.param_groups[0]["lr"] = 1e-2 * 0.5 * 0.5 * (1 + math.cos(math.pi * step / 3))
        out = want(x)
        p, q = (torch.softmax(t / 3.0, -1) for t in (teacher(x).detach(), out))
        kd = 9.0 * (p * (p.log() - q.log())).sum(-1).mean()
        loss = 0.7 * kd + 0.3 * torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(student.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(1) == y).float().mean())


@pytest.mark.timeout(480)
def test_compress_a_run_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch_pruning", reason="torch-pruning is in the dev extra")
    sys.path.insert(0, str(SCRIPT.parent))
    import compress_task

    cfg = tandem.Config()
    cfg.run.dir, cfg.run.name = str(tmp_path), "small"
    cfg.train.steps, cfg.train.global_batch = 40, 64
    cfg.checkpoint.at_end, cfg.monitor.progress, cfg.monitor.report = True, "off", False
    trained = tandem.fit(compress_task.task, config=cfg).model.eval()
    data = compress_task.blobs(256, 1)
    x, y = data.tensors
    with torch.no_grad():
        original = _accuracy(trained(x), y)
    out = tmp_path / "out"
    assert main(["compress", str(tmp_path / "small"), "--script", str(SCRIPT), "--budget",
                 "5", "--out", str(out), "--steps", "10", "--repeats", "1",
                 "--seeds", "2"]) == 0
    found = json.loads((out / "compress.json").read_text())
    assert found["original"]["accuracy"] == pytest.approx(original)
    figures = {c["technique"]: c for c in found["candidates"]}
    assert set(figures) == {"finetuned", "lowrank-50%", "lowrank-25%", "prune-25%",
                            "prune-50%", "int8-ptq", "int8-qat"}
    assert figures["finetuned"]["params"] == 5508  # the control: never adopted
    assert chosen_is_not(found, "finetuned")
    # hidden widths 64 -> 48 and 32, the 4 outputs kept; int8 keeps every weight
    assert figures["prune-25%"]["params"] == 16 * 48 + 48 + 48 * 48 + 48 + 48 * 4 + 4
    assert figures["prune-50%"]["params"] == 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4
    assert figures["int8-qat"]["params"] == found["original"]["params"] == 5508
    assert figures["int8-qat"]["bytes"] < found["original"]["bytes"] / 2
    for c in found["candidates"]:  # two fine-tuning seeds: the mean and its t-interval
        a, b = c["seeds"]
        half = 12.7062 * abs(a - b) / 2  # t(0.975, 1) * sd / sqrt(2), sd = |a - b| / sqrt(2)
        assert c["accuracy"] == pytest.approx((a + b) / 2)
        assert c["interval"] == pytest.approx([(a + b) / 2 - half, (a + b) / 2 + half])
    chosen = found["chosen"]
    assert original - chosen["interval"][0] <= 0.05 + 1e-9
    assert chosen["bytes"] < found["original"]["bytes"]
    within = [c for c in found["candidates"] if original - c["interval"][0] <= 0.05 + 1e-9
              and c["technique"] != "finetuned"]
    assert chosen["bytes"] == min(c["bytes"] for c in within)
    assert {r["technique"] for r in found["rejected"]} == set(figures) - {chosen["technique"]}
    assert chosen["file_bytes"] == (out / "model.pt2").stat().st_size
    # The run's store holds the experiment for its report and the dashboard: one trial
    # per model, the adopted one marked.
    with RunStore(tmp_path / "tandem.db") as store:
        recorded = newest(store.trials(store.run("small")["run_id"]))
    assert [t["plan"]["technique"] for t in recorded] == ["original", *figures]
    assert [t["plan"]["technique"] for t in recorded if t["status"] == "adopted"] == [
        chosen["technique"]]
    # the program loads and runs with torch alone: importing tandem would fail
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys; sys.modules['tandem'] = None; import torch; "
            f"p = torch.export.load({str(out / 'model.pt2')!r}).module(); "
            f"x = torch.load({str(tmp_path / 'x.pt')!r}); "
            f"torch.save(p(x), {str(tmp_path / 'y.pt')!r}); p(x[:1])")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    logits = torch.load(tmp_path / "y.pt", weights_only=True)
    assert _accuracy(logits, y) == pytest.approx(chosen["file_accuracy"])
    assert chosen["file_accuracy"] == chosen["seeds"][0]


class _Watched(FineTune):
    """A fine-tune that also counts, after each masked step, the first layer's zeroed
    rows, and notes each span it trains."""

    def run(self, model, after_step=None, span=None) -> None:  # type: ignore[override]
        SPANS.append(span)

        def watch() -> None:
            after_step()
            ZEROED.append(int((model[0].weight == 0).all(1).sum()))
        super().run(model, watch if after_step else None, span)


ZEROED: list[int] = []
SPANS: list[tuple[int, int]] = []


def test_pruning_masks_on_the_cubic_schedule_removes_at_the_half_and_fine_tunes_on() -> None:
    pytest.importorskip("torch_pruning", reason="torch-pruning is in the dev extra")
    sys.path.insert(0, str(SCRIPT.parent))
    import compress_task

    from tandem.compress.candidates import pruned

    torch.manual_seed(0)
    model = compress_task.make_model()
    x = torch.randn(8, 16)
    for gradual, steps in ((True, 10), (False, 4)):
        ZEROED.clear()
        SPANS.clear()
        out = pruned(model, 0.5, (x,), _Watched(compress_task.task, steps, 32, 0.5, 0),
                     gradual=gradual)
        half = steps // 2
        # the share masked after step s: 0.5 * (1 - (1 - s / half)^3); all at once if not
        share = [0.5 * (1 - (1 - min(1, s / half)) ** 3) if gradual else 0.5
                 for s in range(1, half + 1)]
        assert ZEROED == [64 - math.ceil(64 * (1 - f)) for f in share]
        assert SPANS == [(0, half), (half, steps)]
        assert (out[0].out_features, out[2].in_features, out[2].out_features,
                out[4].out_features) == (32, 32, 32, 4)
