"""A model whose weights, gradients and Adam state exceed one process's memory cap trains
under FSDP with deferred initialisation on 2 processes, and fails on one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "dist" / "scripts" / "big_model.py"
WIDTH, BLOCKS = 2048, 24  # 100.7 M parameters: 403 MB fp32; x4 with grads and Adam
LIMIT_MB = 1300  # data-segment cap above start-up: > half of 1.6 GB, < all of it


def _run(tmp: Path, nproc: int, name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", TANDEM_DATA_LIMIT_MB=str(LIMIT_MB),
               BIG_MODEL_WIDTH=str(WIDTH), BIG_MODEL_BLOCKS=str(BLOCKS))
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", str(nproc),
           str(SCRIPT), "--plan.strategy", "fsdp", "--plan.init", "deferred",
           "--run.dir", str(tmp), "--run.name", name, "--monitor.progress", "log"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)


@pytest.mark.timeout(240)
def test_sharded_training_fits_where_one_process_cannot(tmp_path: Path) -> None:
    state_mb = 4 * BLOCKS * (WIDTH * WIDTH + WIDTH) * 4 / 2**20  # weights+grads+2 moments
    assert state_mb > LIMIT_MB > state_mb / 2
    sharded = _run(tmp_path, 2, "sharded")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "step 3/3" in sharded.stderr
    alone = _run(tmp_path, 1, "alone")
    assert alone.returncode != 0
    assert "can't allocate memory" in alone.stderr, alone.stderr[-3000:]
