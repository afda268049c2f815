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
from tandem.tune.trial import TrialRunner

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "tune_task.py")
FAST = ["--steps", "30", "--log-every", "3", "--trial-timeout", "120"]


def _tune(cwd: Path, *args: str, sleep_ms: str = "2", timeout: float = 400
          ) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
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


@pytest.mark.timeout(420)
def test_tune_fixes_an_input_bound_job(tmp_path: Path) -> None:
    """A loader that sleeps 2 ms per sample with data.workers 0: the tuner must find
    a plan at least 1.3x faster within 10 trials, and say why in a plan file."""
    out = _tune(tmp_path, "--nproc-per-node", "2", "--max-trials", "2", "--budget", "6m",
                *FAST, SCRIPT)
    plan = tomllib.loads((tmp_path / "plan.toml").read_text())
    assert plan["data"]["workers"] >= 2, out.stdout
    assert set(plan) == {"data"}  # only the changed keys
    assert "input-bound" in (tmp_path / "plan.toml").read_text()
    session, trials = _session(tmp_path)
    speedup = session["summary"]["speedup"]
    assert speedup["estimate"] >= 1.3 and speedup["low"] > 1.05, speedup
    assert session["summary"]["trials"] <= 10
    statuses = [t["status"] for t in trials]
    assert statuses[0] == "measured" and "adopted" in statuses
    assert trials[1]["figures"]["kind"] == "control"  # the data bound came first
    adopted = next(t for t in trials if t["status"] == "adopted")
    assert adopted["figures"]["ratio"]["low"] > 1.05
    assert len(adopted["figures"]["baseline_runs"]) == 2  # A/B/A
    # the plan is what tandem run --plan and tandem.fit layer over the script's defaults
    cfg = load(defaults={"data.workers": 0}, plan=tmp_path / "plan.toml")
    assert cfg.data.workers == plan["data"]["workers"]
    report = subprocess.run([sys.executable, "-m", "tandem.cli", "report", session["run_id"],
                             "--html", str(tmp_path / "r.html")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0 and "tuning decisions" in report.stdout
    assert "Tuning decisions" in (tmp_path / "r.html").read_text()


@pytest.mark.timeout(300)
def test_tune_keeps_a_well_configured_plan(tmp_path: Path) -> None:
    """No loading cost and one process: nothing to gain. The tuner must keep the plan,
    including for a change that does nothing at all (prefetch without workers)."""
    _tune(tmp_path, "--nproc-per-node", "1", "--max-trials", "2", "--budget", "4m",
          "--try", "data.prefetch=8", *FAST, SCRIPT, sleep_ms="0")
    text = (tmp_path / "plan.toml").read_text()
    assert tomllib.loads(text) == {}, text
    assert "keep the current plan" in text
    session, trials = _session(tmp_path)
    assert session["summary"]["chosen"] == {}
    assert "adopted" not in [t["status"] for t in trials]
    null = next(t for t in trials if t["figures"].get("label") == "data.prefetch=8")
    assert null["status"] in ("stopped-early", "not-significant")


@pytest.mark.timeout(300)
def test_guardrail_rejects_a_faster_but_diverging_candidate(tmp_path: Path) -> None:
    """More loader workers make it faster; a 32x learning rate (linear scaling against a
    reference batch of 1) makes it diverge. The guardrail must reject it."""
    _tune(tmp_path, "--nproc-per-node", "1", "--max-trials", "1", "--budget", "4m",
          "--try", "data.workers=2,optim.lr_scaling=linear,optim.reference_batch=1", *FAST,
          SCRIPT)
    session, trials = _session(tmp_path)
    tried = next(t for t in trials if t["figures"].get("kind") == "candidate")
    assert tried["status"] == "rejected", tried
    assert tried["figures"]["ratio"]["low"] > 1.05  # it was faster
    verdict = tried["figures"]["guard"]
    assert not verdict["ok"]
    assert not verdict["candidate_loss"] <= verdict["limit"]  # NaN or over the limit
    assert session["summary"]["chosen"] == {}
    assert tomllib.loads((tmp_path / "plan.toml").read_text()) == {}


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
    _tune(tmp_path, "--hparams", "--n-trials", "2", "--steps", "40", "--log-every", "10",
          "--budget", "4m", SCRIPT, "--train.target", "eval_loss<=0.21", sleep_ms="0")
    session, trials = _session(tmp_path)
    assert session["config"]["tune"]["mode"] == "hparams"
    assert [t["trial_id"] for t in trials] == ["00", "01", "02"]
    assert {t["status"] for t in trials[1:]} <= {"complete", "pruned", "failed"}
    study = optuna.load_study(study_name=session["run_id"],
                              storage=f"sqlite:///{tmp_path / 'runs' / 'tandem.db'}")
    assert len(study.trials) == 2
    plan = tomllib.loads((tmp_path / "plan.toml").read_text())
    assert set(plan) <= {"optim", "train"}
