"""`tandem report RUN --validate`: a finding's control experiment, run and recorded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.monitor.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "tune_task.py")


def _tandem(cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               TUNE_TASK_SLEEP_MS="3")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TANDEM_PLAN"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "tandem.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.timeout(470)  # its three commands' own timeouts, and a margin
def test_validate_runs_the_control_and_the_report_shows_it(tmp_path: Path) -> None:
    """An input-bound job (3 ms a sample, 32 samples a step, no loader workers): the
    finding predicts the step's gain without loading; its control (samples served from
    memory) is run in pairs against a placebo and must measure a gain of the same kind,
    recorded for the run and shown by the report; the trial runs stay out of the user's
    store, and a second --validate runs nothing once the finding is settled."""
    _tandem(tmp_path, "run", "--nproc-per-node", "1", SCRIPT, "--train.steps", "30",
            timeout=120)
    store_path = tmp_path / "runs" / "tandem.db"
    with RunStore(store_path) as store:
        (run,) = store.runs()
    out = _tandem(tmp_path, "report", "--validate", "--pairs", "2", "--steps", "12",
                  "--log-every", "3", "--html", str(tmp_path / "r.html"), timeout=260)
    assert "validating input-bound" in out.stdout, out.stdout
    with RunStore(store_path) as store:
        assert [r["run_id"] for r in store.runs()] == [run["run_id"]]  # no trial run here
        rows = {t["trial_id"]: t for t in store.trials(run["run_id"])}
    result = rows["validate:input-bound"]["figures"]
    # 96 ms of loading in a step of about 100 ms: removing it is worth several times
    assert result["predicted"] > 3, result
    assert result["pairs"] >= 2 and result["runs"] == 2 * result["pairs"]
    assert result["interval"][0] > 2 and result["state"] != "refuted", result
    assert result["noise"]["placebo_pairs"] == 2
    shown = f"{result['state']}: predicted {result['predicted']:.2f}x"
    assert shown in out.stdout and shown in (tmp_path / "r.html").read_text()
    assert "tuning decisions" not in out.stdout  # a control experiment is not a tuning trial
    if result["state"] != "inconclusive":  # settled: a second --validate runs nothing
        again = _tandem(tmp_path, "report", "--validate", timeout=60)
        assert "no finding to validate" in again.stdout and shown in again.stdout
