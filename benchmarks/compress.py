"""Compression on the examples, side by side with the original: low-rank factorisation,
channel pruning and int8, each fine-tuned over several seeds, against the original and
against the original fine-tuned alike (the control: what the extra training alone gives).

The original is the example's model trained by the example's recipe (MNIST-1D:
`examples/mnist1d_cnn.py`; char-LM: `examples/char_lm.py`, `--original-steps` to train it
longer), loaded as `tandem compress` loads it (the weight average where the run kept one).
Each candidate is made by `tandem.compress.candidates` (`--steps` fine-tune steps at
`--lr-scale`, `--distill RATIO`: learning from the original as a teacher), once per seed.

Printed per candidate: its metric (MNIST-1D test accuracy, char-LM validation loss in
nats) with a 95% t-interval over the seeds; how much worse than the original and than the
control (paired by seed); its weight elements against the original's; and its CPU
inference speed-up at batch 1 and 64 as the original's time over its own, measured in
`--repeats` interleaved pairs (order alternating), a geometric mean with the interval of
the logs. For int8 (`--int8`) and int4 weights per group (`--int4 GROUP`): the share of
post-training quantisation's loss that QAT recovers (PTQ of the fine-tuned control against
QAT from the original, at the same training), per seed and overall. The int8 models run
their Linear layers on fbgemm's int8 kernels (`quant.kernels`), so their latency is a real
int8 model's against fp32; int4 is emulated in float (accuracy only: no CPU int4 kernel).

    python benchmarks/compress.py --task mnist1d --seeds 5 --steps 300
    python benchmarks/compress.py --task char-lm --seeds 3 --steps 200 --distill 0.5
    python benchmarks/compress.py --task char-lm --seeds 3 --steps 100 --int8 --int4 32 \
        --lowrank --prune
"""

from __future__ import annotations

import argparse
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
from torch import nn  # noqa: E402

import tandem  # noqa: E402
from tandem.compress import candidates as cand  # noqa: E402
from tandem.compress.measure import collate_of, evaluate, model_inputs, weights  # noqa: E402
from tandem.config import load, parse_args  # noqa: E402
from tandem.finetune.init_from import InitFrom  # noqa: E402
from tandem.tune.stats import mean_interval, rate_interval  # noqa: E402

EXAMPLES: dict[str, tuple[tandem.Task, dict[str, Any], str, bool]] = {
    "mnist1d": (mnist1d_cnn.task, mnist1d_cnn.RECIPE, "accuracy", True),
    "char-lm": (char_lm.task, char_lm.RECIPE, "eval_loss", False),
}


def train_original(task: tandem.Task, recipe: dict[str, Any], work: Path,
                   steps: int | None, given: str | None) -> nn.Module:
    """The example's model trained by its recipe (or the run `given`), loaded from its
    checkpoint."""
    if given:
        model = task.model()
        InitFrom(given, field="--original", average=True).load(model)
        return model.eval()
    flags = ["--run.dir", str(work), "--run.name", "original", "--run.seed", "0",
             "--monitor.progress", "off", "--monitor.report", "false",
             "--checkpoint.at_end", "true", "--train.target", "", "--train.eval_every", "0"]
    if steps:
        flags += ["--train.steps", str(steps)]
    tandem.fit(task, config=load(overrides=parse_args(flags).overrides, defaults=recipe))
    model = task.model()
    InitFrom(str(work / "original"), field="original", average=True).load(model)
    return model.eval()


def makers(ns: argparse.Namespace, inputs: tuple[torch.Tensor, ...]
           ) -> dict[str, Callable[[nn.Module, cand.FineTune], nn.Module]]:
    """{candidate name: how it is made from (the original, a fine-tune)}."""
    out: dict[str, Callable[[nn.Module, cand.FineTune], nn.Module]] = {}
    for share in ns.lowrank:
        out[f"lowrank-{share:g}"] = lambda m, t, s=share: cand.lowranked(m, s, t)
    for ratio in ns.prune:
        out[f"prune-{ratio:g}"] = lambda m, t, r=ratio: cand.pruned(m, r, inputs, t,
                                                                    gradual=not ns.oneshot)
    if ns.int8:
        out["int8-qat"] = cand.int8_qat
    if ns.int4:
        out["int4-qat"] = lambda m, t: cand.int8_qat(m, t, bits=4, group=ns.int4)
    return out


def paired_speedup(base: nn.Module, other: nn.Module, args: tuple[torch.Tensor, ...],
                   repeats: int, budget_s: float = 0.05) -> Any:
    """The original's seconds per call over `other`'s: geometric mean and interval over
    `repeats` interleaved pairs (the order alternating)."""
    from tandem.compress.measure import _per_call

    fns = [lambda m=m: m(*args) for m in (base, other)]
    calls = max(_per_call(fn, budget_s)[0] for fn in fns)
    ratios = []
    for r in range(repeats):
        took = [0.0, 0.0]
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            for _ in range(calls):
                fns[i]()
            took[i] = time.perf_counter() - start
        ratios.append(took[0] / took[1])
    return rate_interval(ratios)


def rows_of(t: torch.Tensor, size: int) -> torch.Tensor:
    """`size` rows of `t` (its rows repeated when it has fewer)."""
    return t.repeat(-(-size // t.shape[0]), *[1] * (t.dim() - 1))[:size]


def recovery(scores: dict[str, list[float]], kind: str, sign: float, unit: str) -> None:
    """Print how much of PTQ's loss (against the control) QAT wins back, per seed."""
    ptq, qat = scores[f"{kind}-ptq(control)"], scores[f"{kind}-qat"]
    lost = [sign * (c - p) for c, p in zip(scores["control"], ptq, strict=True)]
    back = [sign * (q - p) for q, p in zip(qat, ptq, strict=True)]
    ratio = statistics.fmean(back) / statistics.fmean(lost) if any(lost) else math.nan
    each = [b / a for a, b in zip(lost, back, strict=True) if a]
    shown = mean_interval(each).text(2) if len(each) == len(lost) > 1 else "n/a"
    print(f"  {kind}: PTQ loses {mean_interval(lost).text(3)} {unit} against the control, "
          f"QAT wins back {mean_interval(back).text(3)}: recovered {ratio:.2f} of it "
          f"(per seed {', '.join(f'{e:.2f}' for e in each)}: {shown})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(EXAMPLES), default="mnist1d")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="fine-tune steps")
    parser.add_argument("--lr-scale", type=float, default=0.3)
    parser.add_argument("--distill", type=float, default=0.0)
    parser.add_argument("--lowrank", type=float, nargs="*", default=[0.5],
                        help="weight shares each factorised layer keeps")
    parser.add_argument("--prune", type=float, nargs="*", default=[0.25],
                        help="channel shares pruned")
    parser.add_argument("--oneshot", action="store_true",
                        help="prune all at once before fine-tuning (default: gradual)")
    parser.add_argument("--int8", action="store_true", help="also int8 PTQ and QAT")
    parser.add_argument("--int4", type=int, default=0, metavar="GROUP",
                        help="also int4 weight PTQ and QAT, per group of GROUP weights")
    parser.add_argument("--original-steps", type=int, default=None)
    parser.add_argument("--original", default=None,
                        help="a run directory of the example trained already (not trained)")
    parser.add_argument("--repeats", type=int, default=10, help="latency pairs")
    parser.add_argument("--latency-only", action="store_true",
                        help="skip the evaluations: the candidates' sizes and latency only "
                             "(which a few fine-tune steps do not change)")
    parser.add_argument("--dir", default=None)
    ns = parser.parse_args()
    task, recipe, metric, higher = EXAMPLES[ns.task]
    torch.set_num_threads(1)
    started = time.perf_counter()
    work = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-compress-"))
    original = train_original(task, recipe, work, ns.original_steps, ns.original)
    data = task.eval_data()
    inputs = model_inputs(task, collate_of(task, data)([data[i] for i in range(64)]))

    def measure(model: nn.Module) -> float:
        if ns.latency_only:
            return math.nan
        return evaluate(model, task, data, metric, recipe["train.eval_batch"])

    base = measure(original)
    print(f"{ns.task} original: {metric} {base:.4f}, {weights(original):,} weights "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    make = makers(ns, inputs)
    scores: dict[str, list[float]] = {name: [] for name in ["control", *make]}
    if ns.int8:
        scores["int8-ptq(control)"] = []
    if ns.int4:
        scores["int4-ptq(control)"] = []
    models: dict[str, nn.Module] = {}
    for seed in range(ns.seeds):
        tune = cand.FineTune(task, ns.steps, recipe["train.global_batch"], ns.lr_scale, seed,
                             teacher=original, distill=ns.distill)
        control = cand.finetuned(original, tune)
        scores["control"].append(measure(control))
        if ns.int8:
            scores["int8-ptq(control)"].append(measure(cand.int8_ptq(control, tune)))
        if ns.int4:
            scores["int4-ptq(control)"].append(measure(cand.int8_ptq(control, tune, 4,
                                                                     ns.int4)))
        for name, fn in make.items():
            model = fn(original, tune)
            models.setdefault(name, model)
            scores[name].append(measure(model))
        print(f"seed {seed}: " + ", ".join(f"{n} {v[-1]:.4f}" for n, v in scores.items()),
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    sign = 100.0 if higher else -1.0  # worse-by in points (accuracy) or nats (loss)
    unit = "points" if higher else "nats"
    print(f"\n{ns.task}: fine-tunes of {ns.steps} steps, lr x{ns.lr_scale}, distill "
          f"{ns.distill}, {ns.seeds} seeds; worse-by in {unit} (95% t over seeds)")
    for name, got in scores.items():
        vs_base = mean_interval([sign * (base - v) for v in got])
        vs_control = mean_interval([sign * (c - v) for c, v in zip(scores["control"], got,
                                                                    strict=True)])
        print(f"  {name:<18} {metric} {mean_interval(got).text(4)}; worse than original "
              f"{vs_base.text(2)}, than control {vs_control.text(2)}")
    for kind, on in (("int8", ns.int8), ("int4", ns.int4)):
        if on:
            recovery(scores, kind, sign, unit)
    print(f"\nCPU inference, 1 thread, original over candidate (x faster), {ns.repeats} "
          "interleaved pairs, geometric mean [95%]:")
    with torch.no_grad():
        for name, model in models.items():
            if name.startswith("int4"):  # emulated in float: its latency means nothing
                continue
            model.eval()
            share = weights(model) / weights(original) if name in scores else math.nan
            speed = {b: paired_speedup(original, model, tuple(rows_of(t, b) for t in inputs),
                                       ns.repeats) for b in (1, 64)}
            print(f"  {name:<22} weights {share:.2f} of the original ({1 - share:.0%} "
                  f"fewer); batch 1 {speed[1].text(3)}x, batch 64 {speed[64].text(3)}x",
                  flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
