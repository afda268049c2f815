"""The README's two-node example, as written: two `tandem run` launchers on one machine,
each given its --node-rank, and each starts the ranks that its node rank says."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.dist.procs import free_port
from tests.reap import kill_tree

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "which_rank.py")


def _launcher(node_rank: int, port: int, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", RANKS_DIR=str(cwd), LAUNCHER_TAG=str(node_rank))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nnodes", "2", "--node-rank",
           str(node_rank), "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
           SCRIPT, "--monitor.progress", "log", "--monitor.report", "false"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(240)
def test_each_launcher_gets_the_ranks_of_its_node_rank(tmp_path: Path) -> None:
    port = free_port()
    # Node 1 first, its agent started before node 0's launcher: a rendezvous that numbers
    # the nodes by their own order (c10d: by host, then process id) would make it node 0.
    procs = [_launcher(1, port, tmp_path)]
    try:
        deadline = time.monotonic() + 60
        while not psutil.Process(procs[0].pid).children():
            assert procs[0].poll() is None and time.monotonic() < deadline, \
                procs[0].communicate()[0]
            time.sleep(0.05)
        procs.append(_launcher(0, port, tmp_path))
        outputs = [p.communicate(timeout=200)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)  # its agent and workers too
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    started = sorted(p.name for p in tmp_path.glob("launcher*_rank*"))
    assert started == ["launcher0_rank0", "launcher0_rank1", "launcher1_rank2",
                       "launcher1_rank3"]
    assert "ignored" not in outputs[0] + outputs[1]  # torch's "--node-rank is ignored"
