"""`tandem run --dashboard`: the dashboard serves the run's store while it runs, then stops."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.dashboard.conftest import get

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "toy_train.py")


@pytest.mark.timeout(120)
def test_run_serves_the_dashboard_until_it_ends(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                "TANDEM_DASHBOARD_TOKEN"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--dashboard", "--nproc-per-node", "1",
           SCRIPT, "--train.steps", "60", "--train.global_batch", "40",
           "--monitor.progress", "off", "--run.name", "dash"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        while url is None:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "tandem run ended without printing a URL"
            if "http://" in line:
                url = line[line.index("http://"):].strip()
        assert str(tmp_path / "runs" / "tandem.db") in line
        base = url.rsplit("/runs", 1)[0]
        seen = None
        while proc.poll() is None and seen is None:
            status, body, _ = get(base + "/api/runs")
            if status == 200:
                seen = next((r for r in json.loads(body)["runs"] if r["name"] == "dash"), None)
            time.sleep(0.1)
        rest = proc.communicate(timeout=90)[1]
        assert proc.returncode == 0, rest
        assert seen is not None and seen["status"] in ("running", "completed")
        port = int(base.rsplit(":", 1)[1])
        with socket.socket() as sock, pytest.raises(OSError):
            sock.settimeout(2)
            sock.connect(("127.0.0.1", port))  # the dashboard ended with the run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
