"""A usage error under `tandem run` is said once even when the rank that would print it
is stopped first (the agent stops every worker once one has exited)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "late_rank0.py")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["auto", "torchrun"])
def test_a_usage_error_is_said_when_rank_1_exits_first(tmp_path: Path, launcher: str) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
               LATE_DIR=str(tmp_path))
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--launcher", launcher,
           "--nproc-per-node", "2", SCRIPT, "--train.stepz", "5"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("tandem: error:")]
    assert len(said) == 1 and "unknown config key 'train.stepz'" in said[0], done.stderr
    assert "Traceback" not in done.stderr
