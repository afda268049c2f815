"""What the one-time calibration costs the README's demo run: its `calibration_s` over the
run's `wall_time_s`, from each run's own summary.

    python benchmarks/calibration_cost.py [--runs 8]

Each run is the README's main command (`tandem run --nproc-per-node 2
examples/mnist1d_cnn.py`, 2 processes, default plan, calibration at step 10) in a fresh
run directory. The first run on a machine also counts the step's FLOPs and measures the
CPU's peak (kept in TANDEM_CACHE_DIR for later runs): one unmeasured run goes first, so
every measured run reads them, as every run after a machine's first does.
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


def demo(src: Path, out: Path, name: str) -> dict[str, float]:
    """One README demo run with tandem from `src`; its calibration and wall time."""
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
           str(ROOT / "examples" / "mnist1d_cnn.py"), "--run.dir", str(out),
           "--run.name", name, "--monitor.progress", "off"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(src))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          cwd=out)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    summary = json.loads((out / name / "summary.json").read_text())
    return {"calibration_s": summary["calibration_s"], "wall_s": summary["wall_time_s"],
            "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="measured runs")
    args = parser.parse_args()
    src = ROOT / "src"
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        demo(src, out, "first")  # counts FLOPs and the peak once, unmeasured
        for i in range(args.runs):
            r = demo(src, out, f"run-{i}")
            runs.append(r)
            print(f"run {i}: calibration {r['calibration_s'] * 1e3:5.1f} ms of "
                  f"{r['wall_s']:.2f} s = {r['calibration_s'] / r['wall_s']:.2%} "
                  f"(load {r['load']:.1f})", flush=True)
    shares = sorted(r["calibration_s"] / r["wall_s"] for r in runs)
    cal = sorted(r["calibration_s"] * 1e3 for r in runs)
    print(f"calibration median {statistics.median(cal):.1f} ms ({cal[0]:.1f}-{cal[-1]:.1f}), "
          f"share of the run median {statistics.median(shares):.2%} "
          f"({shares[0]:.2%}-{shares[-1]:.2%})")


if __name__ == "__main__":
    main()
