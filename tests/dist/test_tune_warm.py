"""Trial runs fork their ranks from the session's fork server (`tune.trial.warm_workers`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from tandem.tune.trial import TrialRunner, warm_workers

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tests" / "dist" / "scripts" / "tune_task.py"
# The task, and a line that records each rank's parent process (the fork server's pid
# for a warm rank, the launcher's for a cold one).
SCRIPT = f"""import os, pathlib, runpy, sys
pathlib.Path(os.environ["PARENTS_DIR"], os.environ["RANK"]).write_text(str(os.getppid()))
sys.argv[0] = {str(TASK)!r}
runpy.run_path({str(TASK)!r}, run_name="__main__")
"""


@pytest.mark.timeout(240)
def test_trial_ranks_are_forked_by_the_sessions_server_which_stops_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "task.py"
    script.write_text(SCRIPT)
    parents = tmp_path / "parents"
    parents.mkdir()
    monkeypatch.setenv("PARENTS_DIR", str(parents))
    monkeypatch.setenv("TUNE_TASK_SLEEP_MS", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    runner = TrialRunner(str(script), [], 2, tmp_path / "work", tmp_path / "runs.db",
                         timeout_s=180)
    with warm_workers(runner):
        server = runner.forkserver
        deadline = time.monotonic() + 120
        while not server.ready():  # its imports take a few seconds
            assert time.monotonic() < deadline and not server.gone(), "never listened"
            time.sleep(0.2)
        pid = server.process.pid
        out = runner.run("warm", {}, steps=6, log_every=3)
        assert out.ok, out.error
        assert {p.name: int(p.read_text()) for p in parents.iterdir()} == {"0": pid, "1": pid}
        assert "starts cold" not in (tmp_path / "work" / "warm.log").read_text()
    # the session's end stops the server (it exits once its workers have)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    # without a server, the launcher starts them itself
    for p in parents.iterdir():
        p.unlink()
    out = runner.run("cold", {}, steps=6, log_every=3)
    assert out.ok, out.error
    assert pid not in {int(p.read_text()) for p in parents.iterdir()}
