"""Step throughput of this tree's code against another revision's, runs interleaved.

    python benchmarks/core_paired.py [--base main] [--pairs 4] [--steps 120]
                                     [--examples mnist1d_cnn char_lm]

The base revision's `src/` is exported (`git archive`) into a temporary folder; each pair
runs the example once on the base code and once on this tree's (order alternating from
pair to pair), one process, no checkpoints, evaluation only at the end. A run's figure is
its median steady-state samples/s (logging windows after the first); the pair's is the
ratio this/base. Printed: every pair's ratio, their geometric mean, and a 95% t-interval
of the mean log ratio (the pair is the unit: windows inside one run are correlated).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks._bench import QUIET, child_env, run_checked, steady, window_values  # noqa: E402

EXAMPLES = {name: ROOT / "examples" / f"{name}.py" for name in ("mnist1d_cnn", "char_lm")}
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def export_src(rev: str, into: Path) -> Path:
    """`src/` of revision `rev`, written under `into`."""
    data = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def one_run(example: str, src: Path, steps: int, out: Path, name: str) -> float:
    """Steady samples/s of one run of `example` on the code under `src`."""
    flags = ["--train.steps", str(steps), "--train.eval_every", "0", "--train.target", "",
             "--monitor.log_every", "20", "--monitor.report", "false", "--run.dir",
             str(out), "--run.name", name, *QUIET]
    env = child_env()
    env["PYTHONPATH"] = f"{src}:{ROOT}"
    run_checked([sys.executable, str(EXAMPLES[example]), *flags], timeout=1800, env=env,
                what=f"{example} on {src}")
    return steady(window_values(out / "tandem.db", name, "samples_per_s"))


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """(geometric mean, low, high) of the ratios, 95% t-interval on the log scale."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = T95.get(len(logs) - 1, 2.0) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = export_src(args.base, Path(tmp) / "base")
        ours = ROOT / "src"
        for example in args.examples:
            ratios = []
            for i in range(args.pairs):
                order = [("base", base), ("this", ours)]
                if i % 2:
                    order.reverse()
                rate = {label: one_run(example, src, args.steps, Path(tmp) / "runs",
                                       f"{example}-{label}-{i}") for label, src in order}
                ratios.append(rate["this"] / rate["base"])
                print(f"{example} pair {i}: base {rate['base']:,.1f}  this "
                      f"{rate['this']:,.1f} samples/s  ratio {ratios[-1]:.3f}", flush=True)
            mean, low, high = interval(ratios)
            print(f"{example}: this/base {mean:.3f} (95% interval {low:.3f}-{high:.3f}, "
                  f"{args.pairs} pairs, {args.steps} steps)", flush=True)


if __name__ == "__main__":
    main()
