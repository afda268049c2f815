"""Ctrl-C during start-up (here: while rank 0 builds the model and rank 1 waits for it in
the preflight's collective) stops the job with one line and status 130, not every
rank's traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reap import kill_tree

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "slow_start.py")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["auto", "torchrun"])
def test_ctrl_c_during_start_up_says_one_line(tmp_path: Path, launcher: str) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
               SLOW_START_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--launcher", launcher,
           "--nproc-per-node", "2", SCRIPT]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 150
        # Rank 0's model factory has started and waits for a file that never comes.
        while not (tmp_path / "building").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # what the terminal's Ctrl-C sends `tandem run`
        out = proc.communicate(timeout=90)[0]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    said = [line for line in out.splitlines() if line.startswith("tandem:")]
    assert said == ["tandem: interrupted during start-up, before the first step; nothing was "
                    "trained or committed by this launch - run the same command again to "
                    "start"], out
    # Besides it, torchrun's agent logs its own shutdown (3 lines); tandem's agent nothing.
    assert len(out.splitlines()) <= (1 if launcher == "auto" else 4), out
