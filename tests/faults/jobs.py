"""Run the toy script as a real `tandem run` job, with faults, and read what it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tandem import checkpoint
from tandem.monitor.store import RunStore
from tests.dist import toy_task

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "toy_train.py")
# Checkpoints committed before the next step: which one a fault at step N meets is fixed.
SYNC_SAVE = ("--checkpoint.async_save", "false")


def env(faults: list[dict] | None = None) -> dict[str, str]:
    """The job's environment: repo importable, one thread, loopback gloo, the faults."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", TANDEM_FAULTS=json.dumps(faults or []))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        out.pop(key, None)
    return out


def command(name: str, nproc: int = 2, restarts: int = 0, *flags: str) -> list[str]:
    """`tandem run` of the toy script: 30 steps of 40 samples, a checkpoint every 5."""
    return [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", str(nproc),
            "--max-restarts", str(restarts), "--monitor-interval", "0.5", SCRIPT,
            "--run.name", name, "--train.steps", "30", "--train.global_batch", "40",
            "--checkpoint.every", "5", "--checkpoint.keep", "3", "--monitor.log_every", "5",
            "--monitor.progress", "log", *flags]


def run(cwd: Path, cmd: list[str], faults: list[dict] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a job to its end; its output is kept for the assertion messages."""
    return subprocess.run(cmd, cwd=cwd, env=env(faults), capture_output=True, text=True,
                          timeout=timeout)


def final_weights(cwd: Path, name: str) -> dict[str, torch.Tensor]:
    """The model weights in the run's newest good checkpoint."""
    path = checkpoint.latest(cwd / "runs" / name / "checkpoints")
    assert path is not None, f"run {name} has no checkpoint"
    state = {"model": toy_task.make_model().state_dict()}
    checkpoint.load(path, state)
    return state["model"]


def events(cwd: Path, name: str) -> list[dict]:
    """The run's events from the run store, in order."""
    with RunStore(cwd / "runs" / "tandem.db") as store:
        return store.events(store.run(name)["run_id"])


def status(cwd: Path, name: str) -> str:
    """The run's status in the run store."""
    with RunStore(cwd / "runs" / "tandem.db") as store:
        return store.run(name)["status"]
