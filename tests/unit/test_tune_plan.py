"""The tuner's pure parts: candidate space, guardrail rule, plan file, trial command line."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from tandem.analyze.diagnosis.diagnose import IN_MEMORY_DATA, NO_COMM, Finding
from tandem.config import load
from tandem.tune import guard, planfile, space
from tandem.tune.session import Record, TuneResult
from tandem.tune.stats import Interval, WindowFigure
from tandem.tune.trial import TrialRunner, flag_keys, plan_toml, strip_flags, windows_of

BASE = space.flatten(load().to_dict())


def _finding(kind: str) -> Finding:
    return Finding(kind, "high", {"share": 0.6}, f"{kind} message -> advice", [])


def test_findings_name_families_and_their_controls() -> None:
    families = space.families_of([_finding("communication-bound"), _finding("input-bound"),
                                  _finding("straggler")])
    assert list(families) == ["comm", "data"]
    assert space.control_of(families["data"]) == IN_MEMORY_DATA
    assert space.control_of(families["comm"]) == NO_COMM
    own = Finding("input-bound", "high", {}, "m", [], control=NO_COMM)
    assert space.control_of(own) == NO_COMM  # the finding's own control wins
    assert space.control_of(_finding("straggler")) == ""


def test_communication_remedies_need_ddp() -> None:
    labels = [c.label for c in space.comm_remedies(BASE, "r", 2, 1.5)]
    assert "plan.comm_hook=fp16" in labels and all(
        c.lossy for c in space.comm_remedies(BASE, "r", 2, 1.5) if "static" not in c.label)
    assert space.comm_remedies(BASE, "r", 1, 1.5) == []
    assert space.comm_remedies({**BASE, "plan.strategy": "fsdp"}, "r", 2, None) == []
    assert space.compute_remedies(BASE, "r", on_gpu=False) == []  # no GPU advice on CPU
    assert [c.changes for c in space.compute_remedies(BASE, "r", on_gpu=True)][0] == {
        "precision.mode": "bf16"}


def test_lossy_changes_are_the_ones_that_change_numerics() -> None:
    lossy = [{"plan.comm_hook": "powersgd"}, {"precision.mode": "bf16"},
             {"plan.strategy": "diloco"}, {"train.micro_batch": 8}, {"optim.warmup_steps": 5}]
    exact = [{"data.workers": 4}, {"plan.bucket_mb": 100.0}, {"plan.strategy": "fsdp"},
             {"plan.static_graph": True}]
    assert all(space.Candidate(c, "x", "").lossy for c in lossy)
    assert not any(space.Candidate(c, "x", "").lossy for c in exact)


def test_only_keys_the_config_has_are_proposed() -> None:
    keys = space.known_keys()
    found = [k for c in (*space.comm_remedies(BASE, "r", 2, None),
                         *space.memory_remedies(BASE, "r", 2),
                         *space.compute_remedies(BASE, "r", True)) for k in c.changes]
    assert found and set(found) <= keys


def test_check_rejects_what_validate_rejects() -> None:
    assert space.check(BASE, {"data.workers": 2}) is None
    problem = space.check(BASE, {"plan.strategy": "fsdp", "plan.comm_hook": "fp16"})
    assert problem and "comm_hook" in problem


def test_parse_try() -> None:
    cand = space.parse_try("data.workers=2, plan.static_graph=true,precision.mode=bf16")
    assert cand.changes == {"data.workers": 2, "plan.static_graph": True,
                            "precision.mode": "bf16"}
    with pytest.raises(ValueError, match="known config key"):
        space.parse_try("data.wrkers=2")


def test_guardrail_rule() -> None:
    base = [(10, 1.0), (20, 0.5), (30, 0.4), (40, 0.3)]
    same = guard.compare(base, [(s, v * 1.01) for s, v in base])
    assert same.ok and same.steps == 40
    # smoothed over the last three windows: (0.5 + 0.4 + 0.3) / 3 = 0.4
    assert same.baseline_loss == pytest.approx(0.4)
    assert same.limit == pytest.approx(0.4 * 1.05 + 1e-3)
    worse = guard.compare(base, [(s, v * 1.2) for s, v in base])
    assert not worse.ok and "limit" in worse.reason
    diverged = guard.compare(base, [(10, 1.0), (20, 5.0), (30, math.nan), (40, math.nan)])
    assert not diverged.ok and "diverged" in diverged.reason
    # only the steps both runs logged count
    partial = guard.compare(base, [(10, 1.0), (20, 0.5)])
    assert partial.steps == 20


def test_plan_file_holds_only_changes_with_evidence(tmp_path: Path) -> None:
    result = TuneResult(
        session_id="tune-x-1", changes={"data.workers": 2, "plan.bucket_mb": 100.0},
        records=[Record("00", "baseline", "baseline", "measured", {}, {},
                        "diagnosis: input-bound (high)")],
        trials=3, wall_s=42.0, speedup=Interval(1.9, 1.8, 2.0, 20), findings=[],
        baseline=Interval(700.0, 680.0, 720.0, 9),
        evidence={"data.workers": "input-bound: data wait 80%; trial 02: 1.9x"})
    text = planfile.render(result, "train.py", 2, "runs/tandem.db", 0.05)
    path = planfile.write(tmp_path / "plan.toml", text)
    assert tomllib.loads(path.read_text()) == {"data": {"workers": 2},
                                               "plan": {"bucket_mb": 100.0}}
    assert "# input-bound: data wait 80%; trial 02: 1.9x" in text
    assert "over 9 runs of the current plan" in text
    cfg = load(defaults={"data.workers": 0}, plan=path, overrides={"plan.bucket_mb": "5"})
    assert cfg.data.workers == 2 and cfg.plan.bucket_mb == 5.0  # flags still win
    keep = planfile.render(TuneResult("tune-x-2", {}, [], 1, 1.0, None, [], None), "t.py", 1,
                           "s", 0.05)
    assert tomllib.loads(keep) == {} and "keep the current plan" in keep
    noise = {"placebo": {"estimate": 1.01, "low": 0.93, "high": 1.1, "n": 3},
             "placebo_pairs": 3, "pair_sd": 0.06, "df": 5, "floor": 1.1}
    keep = planfile.render(TuneResult("tune-x-3", {}, [], 1, 1.0, None, [], None,
                                      noise=noise), "t.py", 1, "s", 0.05)
    assert "1.01 [0.93, 1.1]x over 3 paired runs (pair sd 6.0%)" in keep


def test_trial_command_sets_its_own_flags_and_drops_the_scripts(tmp_path: Path) -> None:
    args = ["--train.steps", "500", "--data.workers=0", "--train.global_batch", "64"]
    assert strip_flags(args, ["train.steps", "data.workers"]) == ["--train.global_batch", "64"]
    assert flag_keys(args) == ["train.steps", "data.workers", "train.global_batch"]
    runner = TrialRunner("train.py", args, 2, tmp_path, tmp_path / "t.db")
    cmd = runner.command("t1", tmp_path / "t1.toml", 30, 3, "", ["data.workers"])
    # the job's own evaluation and checkpoint cadence stay; calibration in the first window
    assert "--train.eval_every" not in cmd and "--checkpoint.every" not in cmd
    assert cmd[cmd.index("--monitor.calibrate_at") + 1] == "1"
    assert cmd[cmd.index("--plan") + 1] == str(tmp_path / "t1.toml")
    assert "--data.workers=0" not in cmd and cmd.count("--train.steps") == 1
    assert cmd[cmd.index("--train.steps") + 1] == "30"
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    control = runner.command("t2", tmp_path / "t2.toml", 30, 3, space.DATA_CONTROL, [])
    assert control[control.index("train.py") - 1].endswith("shim.py")
    assert tomllib.loads(plan_toml({"data.workers": 2, "plan.static_graph": True})) == {
        "data": {"workers": 2}, "plan": {"static_graph": True}}



def test_trial_window_and_window_figures(tmp_path: Path) -> None:
    runner = TrialRunner("train.py", [], 2, tmp_path, tmp_path / "t.db")
    assert runner.window({}, 5) == 5
    runner.job_log_every = 1  # a job that logs every step pays for it in every trial
    assert runner.window({}, 5) == 1
    assert runner.window({"monitor.log_every": 20}, 5) == 5
    rows = [{"step": 4, "value": 400.0, "time": 10.0}, {"step": 8, "value": 800.0,
                                                       "time": 10.2}]
    windows = windows_of(rows, {4: 0.08, 8: 0.04})
    assert windows[0] == WindowFigure(4, 400.0 * 0.32, 0.32, 10.0)
    assert windows[1].samples == pytest.approx(800.0 * 0.16) and windows[1].busy_s == 0.16
