"""The same script, unchanged, under python, torchrun, tandem run and two launcher 'nodes'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist.procs import free_port
from tests.reap import kill_tree

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "toy_train.py")
FLAGS = ["--train.steps", "12", "--train.global_batch", "40", "--monitor.progress", "log"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _summary(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "runs" / name / "summary.json").read_text())


@pytest.mark.timeout(240)
def test_same_script_under_every_launcher(tmp_path: Path) -> None:
    tandem_cli = [sys.executable, "-m", "tandem.cli"]
    _run([sys.executable, SCRIPT, *FLAGS, "--run.name", "plain"], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
          SCRIPT, *FLAGS, "--run.name", "torchrun"], tmp_path)
    _run([*tandem_cli, "run", "--nproc-per-node", "2", SCRIPT, *FLAGS, "--run.name", "tandem"],
         tmp_path)
    plain = _summary(tmp_path, "plain")
    assert plain["world_size"] == 1
    for name in ("torchrun", "tandem"):
        summary = _summary(tmp_path, name)
        assert summary["world_size"] == 2 and summary["steps"] == 12
        assert summary["eval_loss"] == pytest.approx(plain["eval_loss"], rel=1e-5)


@pytest.mark.timeout(180)
def test_two_launchers_as_two_nodes(tmp_path: Path) -> None:
    port = free_port()
    cmds = [[sys.executable, "-m", "tandem.cli", "run", "--nnodes", "2", "--node-rank", str(i),
             "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", "two-nodes", SCRIPT, *FLAGS, "--run.name", "nodes"]
            for i in range(2)]
    procs = [subprocess.Popen(c, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in cmds]
    try:
        outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)  # its torchrun agent and worker too
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    summary = _summary(tmp_path, "nodes")
    assert summary["world_size"] == 2 and summary["steps"] == 12
