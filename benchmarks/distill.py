"""Knowledge distillation on the examples: how much of the gap between a small student and
its teacher the distillation term closes, at the same steps.

The teacher is the example's model trained by the example's recipe: MNIST-1D
(`examples/mnist1d_cnn.py`: the width-64 CNN, Muon, weight average, 150 steps) or the
char-LM (`examples/char_lm.py`: dim 128, 4 layers, 100 steps). For each seed the student
(the CNN at `--width`, or a 2-layer char-LM of dim `--width`) is trained by the same
recipe twice, interleaved: alone, and with the teacher (`train.distill_from`,
`--temperature`, `--ratio`). Each run's final evaluation (MNIST-1D: test accuracy of the
averaged weights; char-LM: validation loss) gives per seed the gap closed, (distilled -
alone) / (teacher - alone); the script prints their mean with a 95% t-interval over the
seeds, and two one-sided paired t-tests: distilled better than alone, and gap closed > 0.5.

    python benchmarks/distill.py --seeds 5
    python benchmarks/distill.py --task char-lm --seeds 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))

import char_lm  # noqa: E402
import mnist1d_cnn  # noqa: E402
import torch  # noqa: E402
from mnist1d_model import make_model  # noqa: E402

import tandem  # noqa: E402
from tandem.config import load, parse_args  # noqa: E402
from tandem.tune.stats import mean_interval, t_cdf  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Example:
    """An example's task, recipe, teacher and student, and the figure compared."""

    task: tandem.Task
    recipe: dict[str, Any]
    teacher: Callable[[], torch.nn.Module]
    student: Callable[[int], torch.nn.Module]
    metric: str
    higher: bool  # whether a higher figure is better
    width: int  # the student's default width
    steps: int  # the students' default steps


EXAMPLES = {
    "mnist1d": Example(mnist1d_cnn.task, mnist1d_cnn.RECIPE, lambda: make_model(64),
                       make_model, "accuracy", True, 16, 600),
    "char-lm": Example(char_lm.task, char_lm.RECIPE, char_lm.CharLM,
                       lambda w: char_lm.CharLM(dim=w, layers=2, heads=2), "eval_loss",
                       False, 64, 100),
}


def figure_of(ex: Example, work: Path, name: str, seed: int,
              student: Callable[[], torch.nn.Module], extra: list[str]) -> float:
    """Train one run of the recipe; its final evaluation's figure (its median step time
    goes to `STEP_S`)."""
    recipe = {**ex.recipe, "train.target": "", "train.eval_every": 0}
    flags = ["--run.dir", str(work), "--run.name", name, "--run.seed", str(seed),
             "--monitor.progress", "off", "--monitor.report", "false", *extra]
    config = load(overrides=parse_args(flags).overrides, defaults=recipe)
    task = dataclasses.replace(ex.task, model=student, teacher=ex.teacher)
    summary = tandem.fit(task, config=config).summary
    STEP_S.setdefault(name.split("-")[0], []).append(float(summary["step_time_p50_s"]))
    return float(summary[ex.metric])


STEP_S: dict[str, list[float]] = {}


def one_sided_p(values: list[float], above: float) -> float:
    """P-value of the paired one-sided t-test that the values' mean exceeds `above`."""
    n, m = len(values), statistics.fmean(values)
    sd = statistics.stdev(values)
    if sd == 0:
        return 0.0 if m > above else 1.0
    return 1 - t_cdf((m - above) / (sd / math.sqrt(n)), n - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(EXAMPLES), default="mnist1d")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--width", type=int, default=None,
                        help="the student's width (default: 16 for MNIST-1D, 64 for char-LM)")
    parser.add_argument("--steps", type=int, default=None,
                        help="the students' steps (default: 600 for MNIST-1D, 100 for "
                             "char-LM; the teacher's: the example's recipe)")
    parser.add_argument("--teacher-steps", type=int, default=None,
                        help="the teacher's steps (default: the example's recipe)")
    parser.add_argument("--teacher", default=None,
                        help="a run directory of the example's model trained already")
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--cache-mb", type=float, default=0.0,
                        help="train.distill_cache_mb of the distilled runs")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ns = parser.parse_args()
    ex = EXAMPLES[ns.task]
    width, steps = ns.width or ex.width, ns.steps or ex.steps
    torch.set_num_threads(1)
    work = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-distill-"))
    started = time.perf_counter()
    longer = ["--train.steps", str(ns.teacher_steps)] if ns.teacher_steps else []
    source = Path(ns.teacher) if ns.teacher else work / "teacher"
    if ns.teacher:  # trained already: its own final evaluation
        teacher = float(json.loads((source / "summary.json").read_text())[ex.metric])
    else:
        teacher = figure_of(ex, work, "teacher", 0, ex.teacher,
                            ["--checkpoint.at_end", "true", "--train.distill_ratio", "0",
                             *longer])
    print(f"{ns.task} teacher: {ex.metric} {teacher:.4f}", flush=True)
    student = ["--checkpoint.at_end", "false", "--train.steps", str(steps)]
    kd = [*student, "--train.distill_from", str(source),
          "--train.distill_temperature", str(ns.temperature),
          "--train.distill_ratio", str(ns.ratio),
          "--train.distill_cache_mb", str(ns.cache_mb)]
    alone = [*student, "--train.distill_ratio", "0"]
    sign = 1.0 if ex.higher else -1.0
    closed, gains = [], []
    for seed in range(ns.seeds):
        arms = [("alone", alone), ("distilled", kd)]
        got = {arm: figure_of(ex, work, f"{arm}-{seed}", seed, lambda: ex.student(width),
                              flags)
               for arm, flags in (arms if seed % 2 == 0 else arms[::-1])}
        gains.append(sign * (got["distilled"] - got["alone"]))
        closed.append(gains[-1] / (sign * (teacher - got["alone"])))
        print(f"seed {seed}: alone {got['alone']:.4f}, distilled {got['distilled']:.4f}, "
              f"gap closed {closed[-1]:.3f}", flush=True)
    interval = mean_interval(closed)
    print(f"\n{ns.task}: student width {width}, {steps} steps, T {ns.temperature}, ratio "
          f"{ns.ratio}, {ns.seeds} seeds: gap closed {interval.estimate:.3f} "
          f"[{interval.low:.3f}, {interval.high:.3f}] (95% t); {ex.metric} gain "
          f"{statistics.fmean(gains):+.4f}; p (distilled better) "
          f"{one_sided_p(gains, 0.0):.2g}; p (gap closed > 0.5) "
          f"{one_sided_p(closed, 0.5):.2g}; median step alone "
          f"{1000 * statistics.median(STEP_S['alone']):.1f} ms, distilled "
          f"{1000 * statistics.median(STEP_S['distilled']):.1f} ms (cache {ns.cache_mb:g} MB); "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
