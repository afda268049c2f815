"""`tandem tune` end to end: real trial runs through `tandem run`, decisions in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tandem.config import load
from tandem.monitor.store import RunStore
from tandem.tune.space import DATA_CONTROL
from tandem.tune.trial import TrialRunner

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "tune_task.py")
# Short sessions: 2 placebo pairs, at most 3 pairs a candidate. Effects in these jobs are
# large (4x and more) so that a decision is reached even when the machine is loaded and
# two runs of one plan differ by a third.
FAST = ["--steps", "24", "--log-every", "3", "--trial-timeout", "240", "--placebo-pairs", "2",
        "--max-pairs", "3"]


def _tune(cwd: Path, *args: str, sleep_ms: str = "2", timeout: float = 400
          ) -> subprocess.CompletedProcess:
    # this checkout's code, not whichever tandem the interpreter has installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               TUNE_TASK_SLEEP_MS=sleep_ms)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TANDEM_PLAN"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "tandem.cli", "tune", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _session(cwd: Path) -> tuple[dict, list[dict]]:
    with RunStore(cwd / "runs" / "tandem.db") as store:
        session = [r for r in store.runs() if "tune" in (r["config"] or {})][-1]
        return session, store.trials(session["run_id"])


@pytest.mark.timeout(900)
def test_tune_fixes_a_misconfigured_job(tmp_path: Path) -> None:
    """Micro-batch 2 under a global batch of 128 on 2 processes: 32 accumulation passes a
    step that memory does not require. The tuner must raise the micro-batch from its
    measurements (never halve it), prove the gain in paired runs beyond its own placebo,
    and say so in the plan file, the store and the report."""
    # Longer runs than FAST: the adopted plan runs a step in ~10 ms, and 24 steps would
    # measure it over a quarter of a second, where one scheduling hiccup of a loaded
    # machine moves the figure by half (pair sd 38% in one such session, against 4% for
    # the slower current plan). 120 steps measure it over about a second, and a fourth
    # pair is allowed before the candidate counts as not significant. Three placebo pairs:
    # with two, one noisy pair (22% between identical runs while the machine was busy)
    # left the pooled noise few degrees of freedom.
    long_runs = ["--steps", "120", "--log-every", "10", "--trial-timeout", "240",
                 "--placebo-pairs", "3", "--max-pairs", "4"]
    out = _tune(tmp_path, "--nproc-per-node", "2", "--max-trials", "1", "--budget", "12m",
                *long_runs, SCRIPT, "--train.global_batch", "128", "--train.micro_batch", "2",
                sleep_ms="0", timeout=880)
    text = (tmp_path / "plan.toml").read_text()
    plan = tomllib.loads(text)
    assert plan == {"train": {"micro_batch": 64}}, out.stdout  # only the changed key
    assert "accumulation passes" in text and "noise: the current plan against itself" in text
    # the plan is what tandem run --plan and tandem.fit layer over the script's defaults
    assert load(defaults={"train.micro_batch": 2},
                plan=tmp_path / "plan.toml").train.micro_batch == 64
    session, trials = _session(tmp_path)
    kinds = [(t["figures"]["kind"], t["status"]) for t in trials]
    assert kinds[:2] == [("baseline", "measured"), ("placebo", "measured")], kinds
    # two placebo pairs first, the third interleaved (or at the end), each time recorded
    assert trials[1]["figures"]["pairs"] == 2
    placebo = [t for t in trials if t["figures"]["kind"] == "placebo"][-1]["figures"]
    assert placebo["pairs"] == 3 and len(placebo["runs"]) == 3
    adopted = next(t for t in trials if t["status"] == "adopted")
    figures = adopted["figures"]
    # the run is the unit: one ratio per pair of runs, in alternating order
    assert figures["pairs"] >= 1 and figures["order"][:2] == ["AB", "BA"][:figures["pairs"]]
    assert len(set(figures["runs"]) | set(figures["baseline_runs"])) == 2 * figures["pairs"]
    assert figures["ratio"]["low"] > figures["noise"]["floor"] >= 1.05
    # the floor: 1 + min_gain, raised to the placebo's bias only when its interval
    # excludes 1 (its spread is in the pooled noise of the candidate's own interval)
    aa = figures["noise"]["placebo"]
    bias = max(aa["estimate"], 1 / aa["estimate"]) if aa["low"] > 1 or aa["high"] < 1 else 1
    assert figures["noise"]["floor"] == pytest.approx(max(1.05, bias))
    assert figures["guard"]["ok"]  # a batch split is checked for convergence too
    speedup = session["summary"]["speedup"]
    assert speedup["low"] > 1.05 and session["summary"]["noise"]["placebo_pairs"] == 3
    report = subprocess.run([sys.executable, "-m", "tandem.cli", "report", session["run_id"],
                             "--html", str(tmp_path / "r.html")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "tuning decisions" in report.stdout
    assert "placebo" in report.stdout
    assert "Tuning decisions" in (tmp_path / "r.html").read_text()


@pytest.mark.timeout(700)
def test_tune_keeps_a_well_configured_plan_and_guards_convergence(tmp_path: Path) -> None:
    """No loading cost, one process: nothing to gain. A deliberate placebo arm (a DDP
    bucket size, on one process where there is no DDP) must not be adopted. A second
    candidate changes the numerics: a 32x learning rate (linear scaling against a
    reference batch of 1) that diverges; the convergence guardrail must reject it on its
    first pair of runs, whatever its speed, before more runs are spent on it."""
    lossy = "data.workers=2,optim.lr_scaling=linear,optim.reference_batch=1"
    _tune(tmp_path, "--nproc-per-node", "1", "--max-trials", "2", "--budget", "10m",
          "--try", "plan.bucket_mb=100", "--try", lossy, *FAST, SCRIPT, sleep_ms="0",
          timeout=680)
    text = (tmp_path / "plan.toml").read_text()
    assert tomllib.loads(text) == {}, text
    assert "keep the current plan" in text
    session, trials = _session(tmp_path)
    assert session["summary"]["chosen"] == {}
    assert "adopted" not in [t["status"] for t in trials]
    null = next(t for t in trials if t["figures"].get("label") == "plan.bucket_mb=100")
    assert null["status"] in ("stopped-early", "not-significant")
    assert null["figures"]["ratio"]["low"] <= null["figures"]["noise"]["floor"]
    tried = next(t for t in trials if t["figures"].get("label") == lossy.replace(",", ", "))
    assert tried["status"] == "rejected", tried
    assert tried["figures"]["pairs"] == 1
    verdict = tried["figures"]["guard"]
    assert not verdict["ok"]
    assert not verdict["candidate_loss"] <= verdict["limit"]  # NaN or over the limit


@pytest.mark.timeout(300)
def test_the_data_control_serves_samples_from_memory(tmp_path: Path) -> None:
    """The in-memory data control of an input-bound job (2 ms per sample, no workers)
    runs its steps without the loading cost; the job's settings resolve without a run."""
    env = {"TUNE_TASK_SLEEP_MS": "2", "GLOO_SOCKET_IFNAME": "lo"}
    runner = TrialRunner(SCRIPT, ["--train.global_batch", "32"], 1, tmp_path / "w",
                         tmp_path / "t.db", timeout_s=240, env=env)
    job = runner.resolve()
    assert job["train.global_batch"] == 32 and job["data.workers"] == 0
    slow = runner.run("slow", {}, 12, 3)
    fast = runner.run("fast", {}, 12, 3, control=DATA_CONTROL)
    assert slow.ok and fast.ok, (slow.error, fast.error)
    # 16 ms of loading a step removed from a step of a few ms
    assert fast.figures["step"] > 2 * slow.figures["step"], (slow.figures, fast.figures)


@pytest.mark.timeout(120)
def test_a_crash_or_a_hang_is_recorded_not_raised(tmp_path: Path) -> None:
    crash, hang = tmp_path / "crash.py", tmp_path / "hang.py"
    crash.write_text("raise SystemExit(3)\n")
    hang.write_text("import time\ntime.sleep(600)\n")
    out = TrialRunner(str(crash), [], 1, tmp_path / "w", tmp_path / "t.db",
                      timeout_s=90).run("crash", {}, 4, 2)
    assert not out.ok and "exit status" in out.error
    out = TrialRunner(str(hang), [], 1, tmp_path / "w", tmp_path / "t.db",
                      timeout_s=3).run("hang", {}, 4, 2)
    assert not out.ok and "timed out" in out.error


@pytest.mark.timeout(300)
def test_hparams_search_mirrors_an_optuna_study_into_the_store(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    # --min-gain 0.99: no trial can be that much faster, so no confirmation runs here
    # (the confirmation's statistics are tested in tests/unit/test_tune_hparams.py)
    out = _tune(tmp_path, "--hparams", "--n-trials", "2", "--steps", "40", "--log-every",
                "10", "--budget", "4m", "--min-gain", "0.99", SCRIPT, "--train.target",
                "eval_loss<=0.21", sleep_ms="0").stdout
    session, trials = _session(tmp_path)
    assert session["config"]["tune"]["mode"] == "hparams"
    # the decision says why nothing was chosen, with the bar the best trial missed
    decision = session["summary"]["decision"]
    assert decision.startswith("keep the current settings: ")
    assert ("no trial completed" in decision or "in its one run; nothing to confirm"
            in decision), decision
    assert decision in " ".join(out.split()), out  # printed too
    assert [t["trial_id"] for t in trials] == ["00", "01", "02"]
    assert {t["status"] for t in trials[1:]} <= {"complete", "pruned", "failed"}
    study = optuna.load_study(study_name=session["run_id"],
                              storage=f"sqlite:///{tmp_path / 'runs' / 'tandem.db'}")
    assert len(study.trials) == 2
    plan = tomllib.loads((tmp_path / "plan.toml").read_text())
    assert set(plan) <= {"optim", "train"}
