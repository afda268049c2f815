"""benchmarks/gpu_check.py without a GPU: its CPU rehearsal, its time limits and budget."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_check  # noqa: E402


@pytest.mark.timeout(120)
def test_cpu_rehearsal_runs_the_checks_and_writes_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--cpu", "--only", "prefetch", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    rows = {r["check"]: r for r in report["rows"]}
    assert list(rows) == ["prefetch_content", "prefetch_overlap"]
    # What runs on a CPU ran and passed there (the loader's batches, checked against the
    # dataset rows); what needs CUDA says so.
    content = rows["prefetch_content"]
    assert content["status"] == "skipped" and content["rehearsal"] == "pass", content
    assert content["reason"] == gpu_check.REHEARSED
    assert content["figure"].endswith(": 0 wrong")
    assert rows["prefetch_overlap"]["status"] == "skipped"
    assert "no CUDA device" in rows["prefetch_overlap"]["reason"]
    assert report["env"]["device"] == "cpu"
    for name in rows:
        assert f"| {name} " in printed


@pytest.mark.timeout(60)
def test_a_check_past_its_limit_is_killed_with_what_it_started(tmp_path: Path) -> None:
    # The grandchild leaves the session, as `tandem run` starts its agent.
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
              " start_new_session=True)\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(60)\n")
    log = tmp_path / "log"
    start = time.monotonic()
    code = gpu_check.run_tree([sys.executable, "-c", script], timeout=3.0,
                              env=dict(os.environ), log=log)
    assert code is None
    assert time.monotonic() - start < 30
    grandchild = int(log.read_text().split()[0])
    try:
        assert psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_a_spent_budget_skips_the_remaining_checks_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--cpu", "--budget", "10", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["check"] for r in rows] == list(gpu_check.CHECKS)
    assert all(r["status"] == "skipped" and "budget of 10 s" in r["reason"] for r in rows)


def test_a_failed_rehearsal_stays_a_failure() -> None:
    failed = {"check": "x", "what": "", "figure": "", "status": "fail", "reason": "broke",
              "details": {}}
    assert gpu_check.rehearsed(failed)["status"] == "fail"
    assert "CPU rehearsal failed: broke" == gpu_check.rehearsed(failed)["reason"]
