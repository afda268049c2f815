"""Throughput of the examples at 1 and 2 processes, and the scaling between them.

    python benchmarks/throughput.py [--steps 200] [--repeats 2]

Runs each example for a fixed number of steps (no checkpoints, evaluation only at the
end), 1 and 2 processes interleaved, and prints the median steady-state samples/s
(and tokens/s for the language model) from the run store: logging windows after the
first, so start-up and warm-up are excluded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tandem.monitor.store import RunStore  # noqa: E402

EXAMPLES = {name: ROOT / "examples" / f"{name}.py" for name in ("mnist1d_cnn", "char_lm")}


def steady_rate(store_path: Path, name: str, metric: str) -> float:
    """Median of a run's logging-window figure, first window excluded."""
    with RunStore(store_path) as store:
        rows = store.metrics(store.run(name)["run_id"], name=metric, rank=-1)
    return statistics.median(r["value"] for r in rows[1:])


def run(example: str, nproc: int, steps: int, out: Path, name: str) -> None:
    """One run of an example under torchrun."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(EXAMPLES[example]), "--train.steps", str(steps),
           "--train.eval_every", "0", "--checkpoint.every", "0", "--checkpoint.at_end",
           "false", "--train.target", "", "--monitor.log_every", "20", "--monitor.progress",
           "off", "--run.dir", str(out), "--run.name", name]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise RuntimeError(f"{example} x{nproc} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rates: dict[tuple[str, int], list[float]] = {}
        for i in range(args.repeats):
            for example in args.examples:
                for nproc in (1, 2):
                    name = f"{example}-{nproc}-{i}"
                    run(example, nproc, args.steps, out, name)
                    rate = steady_rate(out / "tandem.db", name, "samples_per_s")
                    rates.setdefault((example, nproc), []).append(rate)
                    print(f"{name}: {rate:,.1f} samples/s", flush=True)
    print(f"\nmedian steady-state throughput, {args.steps} steps, {args.repeats} repeats:")
    for example in args.examples:
        one = statistics.median(rates[(example, 1)])
        two = statistics.median(rates[(example, 2)])
        extra = ""
        if example == "char_lm":
            extra = f"  ({one * 128:,.0f} -> {two * 128:,.0f} tokens/s)"
        print(f"  {example:8s} 1 process {one:9,.1f}  2 processes {two:9,.1f} samples/s  "
              f"scaling {two / one:.2f}x{extra}")


if __name__ == "__main__":
    main()
