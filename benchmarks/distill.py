"""Knowledge distillation on MNIST-1D: how much of the gap between a small student and its
teacher the distillation term closes, at the same steps.

The teacher is the demo's model (`examples/mnist1d_model.py`, width 64) trained by the
demo's recipe (`examples/mnist1d_cnn.py`: Muon, weight average, 150 steps). For each seed
the student (the same CNN at `--width`) is trained by the same recipe twice, interleaved:
alone, and with the teacher (`train.distill_from`, `--temperature`, `--ratio`). Each run's
test accuracy (of the averaged weights, on the 1000 test samples) gives per seed the gap
closed, (distilled - alone) / (teacher - alone); the script prints their mean with a 95%
t-interval over the seeds, and two one-sided paired t-tests: distilled > alone, and gap
closed > 0.5.

    python benchmarks/distill.py --seeds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from mnist1d_cnn import RECIPE, task  # noqa: E402
from mnist1d_model import make_model  # noqa: E402

import tandem  # noqa: E402
from tandem.config import load, parse_args  # noqa: E402
from tandem.tune.stats import mean_interval, t_cdf  # noqa: E402

TEACHER_WIDTH = 64


def accuracy_of(work: Path, name: str, seed: int, width: int, extra: list[str]) -> float:
    """Train one run of the recipe; its final test accuracy."""
    recipe = {**RECIPE, "train.target": "", "train.eval_every": 0}
    flags = ["--run.dir", str(work), "--run.name", name, "--run.seed", str(seed),
             "--monitor.progress", "off", "--monitor.report", "false", *extra]
    config = load(overrides=parse_args(flags).overrides, defaults=recipe)
    student = dataclasses.replace(task, model=lambda: make_model(width),
                                  teacher=lambda: make_model(TEACHER_WIDTH))
    return float(tandem.fit(student, config=config).summary["accuracy"])


def one_sided_p(values: list[float], above: float) -> float:
    """P-value of the paired one-sided t-test that the values' mean exceeds `above`."""
    n, m = len(values), statistics.fmean(values)
    sd = statistics.stdev(values)
    if sd == 0:
        return 0.0 if m > above else 1.0
    return 1 - t_cdf((m - above) / (sd / math.sqrt(n)), n - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--width", type=int, default=16, help="the student's width")
    parser.add_argument("--steps", type=int, default=600,
                        help="the students' steps (the teacher's: the demo's)")
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ns = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-distill-"))
    started = time.perf_counter()
    teacher = accuracy_of(work, "teacher", 0, TEACHER_WIDTH,
                          ["--checkpoint.at_end", "true", "--train.distill_ratio", "0"])
    print(f"teacher (width {TEACHER_WIDTH}): test accuracy {teacher:.4f}", flush=True)
    student = ["--checkpoint.at_end", "false", "--train.steps", str(ns.steps)]
    kd = [*student, "--train.distill_from", str(work / "teacher"),
          "--train.distill_temperature", str(ns.temperature),
          "--train.distill_ratio", str(ns.ratio)]
    alone = [*student, "--train.distill_ratio", "0"]
    closed, gains = [], []
    for seed in range(ns.seeds):
        arms = [("alone", alone), ("distilled", kd)]
        got = {arm: accuracy_of(work, f"{arm}-{seed}", seed, ns.width, flags)
               for arm, flags in (arms if seed % 2 == 0 else arms[::-1])}
        gains.append(got["distilled"] - got["alone"])
        closed.append(gains[-1] / (teacher - got["alone"]))
        print(f"seed {seed}: alone {got['alone']:.4f}, distilled {got['distilled']:.4f}, "
              f"gap closed {closed[-1]:.3f}", flush=True)
    interval = mean_interval(closed)
    print(f"\nstudent width {ns.width}, {ns.steps} steps, T {ns.temperature}, ratio {ns.ratio}, "
          f"{ns.seeds} seeds: gap closed {interval.estimate:.3f} "
          f"[{interval.low:.3f}, {interval.high:.3f}] (95% t); accuracy gain "
          f"{statistics.fmean(gains):+.4f}; p (distilled > alone) "
          f"{one_sided_p(gains, 0.0):.2g}; p (gap closed > 0.5) "
          f"{one_sided_p(closed, 0.5):.2g}; {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
