"""tandem vs a hand-written DDP loop on the same model, data and batch, side by side.

    python benchmarks/overhead.py [--nproc 2] [--steps 300] [--repeats 3]

Runs the two contenders interleaved (A, B, A, B, ...) under torchrun. Each logs every
25 steps (the baseline all-reduces its loss; tandem gathers its window figures); the
throughput of a run is measured end to end between its first and last logging line
(wall clock, so logging costs count), which leaves start-up and the first window out.
Prints the median over repeats and the ratio tandem / baseline.
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
sys.path.insert(0, str(ROOT / "src"))

from tandem.monitor.store import RunStore  # noqa: E402


def _torchrun(nproc: int, script: Path, args: list[str], cwd: str) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def tandem_rate(nproc: int, steps: int, batch: int, cwd: str, name: str) -> float:
    _torchrun(nproc, ROOT / "examples" / "mnist1d_cnn.py",
              ["--train.steps", str(steps), "--train.global_batch", str(batch),
               "--train.eval_every", "0", "--checkpoint.every", "0",
               "--checkpoint.at_end", "false", "--train.target", "",
               "--monitor.log_every", "25", "--monitor.progress", "off",
               "--run.name", name, "--run.dir", cwd], cwd)
    with RunStore(Path(cwd) / "tandem.db") as store:
        rows = store.metrics(store.run(name)["run_id"], name="loss", rank=-1)
    return _rate([(r["step"], r["time"]) for r in rows], batch)


def baseline_rate(nproc: int, steps: int, batch: int, cwd: str) -> float:
    out = _torchrun(nproc, ROOT / "benchmarks" / "ddp_baseline.py",
                    ["--steps", str(steps), "--global-batch", str(batch)], cwd)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return _rate([(r["step"], r["time"]) for r in rows], batch)


def _rate(marks: list[tuple[int, float]], batch: int) -> float:
    """Samples/s between the first and the last logging line."""
    (s0, t0), (s1, t1) = marks[0], marks[-1]
    return (s1 - s0) * batch / (t1 - t0)


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
