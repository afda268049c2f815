"""A metric that fails at a mid-run evaluation loses no step: every rank agrees, the step
is committed (checkpoint.every 0), the metric and its shape are named in one line, and
the same command continues from that step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.dist import toy_task
from tests.dist.procs import run_ranks

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "dist" / "scripts" / "eval_vector_metric.py")
STEPS, EVERY, GLOBAL = 12, 5, 40
FLAGS = ["--train.steps", str(STEPS), "--train.global_batch", str(GLOBAL),
         "--train.eval_every", str(EVERY), "--train.eval_batch", "64",
         "--checkpoint.every", "0", "--monitor.progress", "log", "--monitor.calibrate_at", "0",
         "--monitor.report", "false", "--run.seed", "7"]


def _train(rank: int, world: int, out: str, good: bool) -> None:
    from tandem.trainer.evaluate import EvaluationError
    from tests.dist.scripts import eval_vector_metric

    sys.argv = [SCRIPT, *(["--good-metric"] if good else [])]  # what the metric reads
    cfg = toy_task.config(out, STEPS, GLOBAL, train={"eval_every": EVERY, "eval_batch": 64})
    try:
        result = eval_vector_metric.tandem.fit(eval_vector_metric.task, config=cfg)
    except EvaluationError as err:
        Path(out, f"error{rank}.txt").write_text(str(err))
        return
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "weights.pt"))


@pytest.mark.timeout(200)
def test_failed_mid_run_evaluation_commits_its_step_and_resumes(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), False, timeout=90)
    errors = [(tmp_path / f"error{r}.txt").read_text() for r in range(2)]
    assert errors[0] == errors[1]  # every rank raised the same, agreed error
    assert "evaluation at step 5 failed" in errors[0]
    assert "Task.metrics['abs_error'] returned a tensor of shape [64]" in errors[0]
    assert "scalar" in errors[0] and "step 5 and its checkpoint is committed" in errors[0]
    assert [p.name for p in (tmp_path / "toy" / "checkpoints").glob("step_*")] == [
        "step_000000005"]
    # Fixed, the same run continues from step 5 and trains what an uninterrupted run does.
    run_ranks(_train, 2, str(tmp_path), True, timeout=90)
    ref, _ = toy_task.reference(STEPS, GLOBAL)
    got = torch.load(tmp_path / "weights.pt", weights_only=True)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(200)
def test_tandem_run_says_it_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2", SCRIPT, *FLAGS]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    said = [line for line in out.splitlines() if "abs_error" in line]
    assert len(said) == 1, out
    assert "evaluation at step 5 failed" in said[0] and "[64]" in said[0], out
    assert (tmp_path / "runs" / "eval_vector_metric" / "checkpoints" / "step_000000005").is_dir()
