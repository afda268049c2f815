"""What full telemetry costs: the same run with telemetry off and on, interleaved.

    python benchmarks/telemetry_overhead.py [--repeats 3] [--nproc 2]

"off": no phase timing, no calibration, no liveness thread, one logging window for the
whole run. "steady": the defaults without the one-time calibration (phase timing, a
cross-rank gather and detectors every 10 steps, liveness records, the run store).
"on": the defaults, with the calibration at step 10 (extra forward/backward passes, a
FLOP count, a matmul peak and an all-reduce probe: a fixed cost, shown over a short run). Each run's
throughput is its samples over the trainer's own wall clock from the first step to the
last, less the final evaluation (checkpoints off), so every monitoring cost inside the
loop counts.
Prints the median over repeats and the overhead of "on" for each example.
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
EXAMPLES = {"mnist1d_cnn": 400, "char_lm": 150}  # steps per run
OFF = ["--monitor.timing", "false", "--monitor.calibrate_at", "0", "--fault.heartbeat_s", "0"]


MODES = {"off": [*OFF], "steady": ["--monitor.calibrate_at", "0"], "on": []}


def run(example: str, steps: int, nproc: int, out: Path, name: str, mode: str) -> float:
    """Samples/s of one run, from its summary (trainer wall clock)."""
    flags = MODES[mode] + (["--monitor.log_every", str(steps)] if mode == "off" else [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(ROOT / "examples" / f"{example}.py"),
           "--train.steps", str(steps), "--train.eval_every", "0", "--train.target", "",
           "--checkpoint.every", "0", "--checkpoint.at_end", "false",
           "--monitor.progress", "off", "--run.dir", str(out), "--run.name", name, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / name / "summary.json").read_text())
    # The final evaluation is the same in both modes: leave it out, not to dilute.
    loop_s = summary["wall_time_s"] - summary["eval_time_s"]
    return summary["steps"] * summary["global_batch"] / loop_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for example in args.examples:
            rates: dict[str, list[float]] = {mode: [] for mode in MODES}
            for i in range(args.repeats):
                for mode in MODES:
                    name = f"{example}-{mode}-{i}"
                    rate = run(example, EXAMPLES[example], args.nproc, Path(tmp), name, mode)
                    rates[mode].append(rate)
                    print(f"{name}: {rate:,.1f} samples/s", flush=True)
            med = {mode: statistics.median(values) for mode, values in rates.items()}
            print(f"{example} ({EXAMPLES[example]} steps, median of {args.repeats}): off "
                  f"{med['off']:,.1f}, steady {med['steady']:,.1f}, on {med['on']:,.1f} "
                  f"samples/s -> steady-state overhead {1 - med['steady'] / med['off']:+.1%}, "
                  f"with calibration {1 - med['on'] / med['off']:+.1%}\n", flush=True)


if __name__ == "__main__":
    main()
