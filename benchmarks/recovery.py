"""Recovery from killed workers: detection + restart time, steps redone, same weights.

    python benchmarks/recovery.py [--kills 3] [--steps 120] [--every 10] [--seed 0]

Runs the toy job twice under `tandem run --nproc-per-node 2`: once clean, once with
`--kills` SIGKILLs of a random rank at random steps (one per restart attempt, injected
with TANDEM_FAULTS). For each kill it reports the time from the kill to the restarted
group's first record (detection + restart + resume), the steps redone, and at the end
the checkpoint blocking time and whether the final weights equal the clean run's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tandem import checkpoint  # noqa: E402
from tandem.monitor.store import RunStore  # noqa: E402
from tests.dist import toy_task  # noqa: E402

SCRIPT = ROOT / "tests" / "dist" / "scripts" / "toy_train.py"


def job(cwd: Path, name: str, steps: int, every: int, restarts: int, faults: list[dict],
        fault_log: Path) -> None:
    """One `tandem run` of the toy script."""
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--monitor-interval", "0.5", str(SCRIPT),
           "--run.name", name, "--train.steps", str(steps), "--train.global_batch", "40",
           "--checkpoint.every", str(every), "--monitor.log_every", "5",
           "--monitor.progress", "off"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", TANDEM_FAULTS=json.dumps(faults),
               TANDEM_FAULT_LOG=str(fault_log))
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")


def weights(cwd: Path, name: str) -> dict[str, torch.Tensor]:
    """Final model weights of a run, from its newest checkpoint."""
    state = {"model": toy_task.make_model().state_dict()}
    checkpoint.load(checkpoint.latest(cwd / "runs" / name / "checkpoints"), state)
    return state["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kill_steps = sorted(rng.sample(range(5, args.steps - 5), args.kills))
    faults = [{"rank": rng.randrange(2), "step": s, "phase": "compute", "kind": "kill",
               "attempt": i} for i, s in enumerate(kill_steps)]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        log = cwd / "faults.jsonl"
        job(cwd, "clean", args.steps, args.every, 0, [], log)
        job(cwd, "faulty", args.steps, args.every, args.kills, faults, log)
        kills = [json.loads(line) for line in log.read_text().splitlines()]
        with RunStore(cwd / "runs" / "tandem.db") as store:
            run_id = store.run("faulty")["run_id"]
            resumes = [e for e in store.events(run_id) if e["kind"] == "resume"]
            blocking = [m["value"] for m in store.metrics(run_id,
                                                          name="time/checkpoint_blocking_s")]
        same = all(torch.equal(a, b) for a, b in zip(weights(cwd, "clean").values(),
                                                     weights(cwd, "faulty").values(),
                                                     strict=True))
    print(f"{args.kills} kills at steps {kill_steps}, checkpoint every {args.every} steps, "
          f"2 processes (gloo, CPU):")
    for kill, resume in zip(kills, resumes, strict=True):
        redone = kill["step"] - resume["step"]
        print(f"  kill rank {kill['rank']} at step {kill['step']}: back at step "
              f"{resume['step']} after {resume['time'] - kill['time']:.1f} s "
              f"(detect + restart + load), {redone} steps redone")
    print(f"  checkpoint blocking time: median {statistics.median(blocking) * 1e3:.1f} ms "
          f"over {len(blocking)} checkpoints")
    print(f"  final weights equal to the clean run: {same}")


if __name__ == "__main__":
    main()
