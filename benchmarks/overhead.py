"""tandem vs a hand-written DDP loop on the same model, data and batch, side by side.

    python benchmarks/overhead.py [--nproc 2] [--steps 300] [--repeats 3]

Runs the two contenders interleaved (A, B, A, B, ...) under torchrun, takes each run's
median steady-state throughput (logging windows after the first) and prints the ratio
tandem / baseline. Both log the loss every 25 steps with one all-reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(nproc: int, script: Path, args: list[str], cwd: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def tandem_rate(nproc: int, steps: int, batch: int, cwd: str, name: str) -> float:
    _torchrun(nproc, ROOT / "examples" / "mnist1d.py",
              ["--train.steps", str(steps), "--train.global_batch", str(batch),
               "--train.eval_every", "0", "--checkpoint.at_end", "false",
               "--monitor.log_every", "25", "--monitor.progress", "off",
               "--run.name", name, "--run.dir", cwd], cwd)
    rows = [json.loads(line) for line in Path(cwd, name, "metrics.jsonl").open()]
    rates = [r["samples_per_s"] for r in rows if r.get("kind") == "train"]
    return statistics.median(rates[1:])


def baseline_rate(nproc: int, steps: int, batch: int, cwd: str) -> float:
    out = _torchrun(nproc, ROOT / "benchmarks" / "ddp_baseline.py",
                    ["--steps", str(steps), "--global-batch", str(batch)], cwd)
    rates = [json.loads(line)["samples_per_s"] for line in out.splitlines() if line.startswith("{")]
    return statistics.median(rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            ours.append(tandem_rate(args.nproc, args.steps, args.batch, tmp, f"r{i}"))
            theirs.append(baseline_rate(args.nproc, args.steps, args.batch, tmp))
            print(f"repeat {i}: tandem {ours[-1]:,.0f} samples/s, "
                  f"hand-written DDP {theirs[-1]:,.0f} samples/s", flush=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"\nMNIST-1D, {args.nproc} processes, global batch {args.batch}, "
          f"{args.steps} steps, {args.repeats} interleaved repeats (medians):")
    print(f"  tandem            {a:,.0f} samples/s")
    print(f"  hand-written DDP  {b:,.0f} samples/s")
    print(f"  ratio tandem / hand-written = {a / b:.3f}")


if __name__ == "__main__":
    main()
