"""The scaling model checked against real runs: each run predicts the other sizes.

    python benchmarks/scaling_model.py [--repeats 3] [--sizes 1,2,4] [--out DIR]

Runs each example at every size, interleaved (the order of sizes rotates each repeat),
each run a fresh `torchrun --standalone` job with no checkpoints and evaluation only at
the end. Then every run predicts every other size from its own store rows
(`tandem.analyze.scaling.model.predict`, fitted from that run alone and the machine's
core count) and the prediction is compared with the runs measured at that size:

- **median**: the median prediction over the source runs against the median measured
  samples/s over the target runs, and its error;
- **paired**: each source run against the target run of the same repeat (minutes
  apart), the median and the range of those errors;
- **in interval**: how many of those target runs fell inside the source's interval;
- **oracle load**: the same pairs, but told the foreign load the target run saw (from
  that run's CPU figures): what is left is the model's error, not the machine's drift.

The machine's load average is printed before and after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench import child_env, run_checked, table  # noqa: E402

from tandem.analyze.scaling.inputs import run_figures  # noqa: E402
from tandem.analyze.scaling.model import (  # noqa: E402
    RunFigures,
    background_threads,
    predict_one,
)

EXAMPLES = {  # script, steps, log_every
    "mnist1d_cnn": (ROOT / "examples" / "mnist1d_cnn.py", 300, 20),
    "char_lm": (ROOT / "examples" / "char_lm.py", 80, 10),
}


def launch(example: str, nproc: int, steps: int, out: Path, name: str) -> dict[str, float]:
    """One run under torchrun; the load average before and after it."""
    script, _, log_every = EXAMPLES[example]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), "--train.steps", str(steps),
           "--train.eval_every", "0", "--checkpoint.every", "0", "--checkpoint.at_end",
           "false", "--train.target", "", "--monitor.log_every", str(log_every),
           "--monitor.progress", "off", "--run.dir", str(out), "--run.name", name]
    before = os.getloadavg()[0]
    started = time.perf_counter()
    run_checked(cmd, timeout=1800, env=child_env(), what=f"{example} x{nproc}")
    return {"load_before": before, "load_after": os.getloadavg()[0],
            "wall_s": time.perf_counter() - started}


def run_all(args: argparse.Namespace, out: Path) -> dict[str, dict[tuple[int, int], str]]:
    """Every (example, size, repeat) run, interleaved; run names by (size, repeat)."""
    names: dict[str, dict[tuple[int, int], str]] = {ex: {} for ex in args.examples}
    for r in range(args.repeats):
        sizes = args.sizes[r % len(args.sizes):] + args.sizes[:r % len(args.sizes)]
        for example in args.examples:
            steps = args.steps.get(example, EXAMPLES[example][1])
            for n in sizes:
                name = f"{example}-n{n}-r{r}"
                info = launch(example, n, steps, out, name)
                names[example][(n, r)] = name
                print(f"[{time.strftime('%H:%M:%S')}] {name}: {info['wall_s']:.0f} s, load "
                      f"{info['load_before']:.1f} -> {info['load_after']:.1f}", flush=True)
    return names


def _err(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def compare(figs: dict[tuple[int, int], RunFigures], sizes: list[int]) -> list[list[str]]:
    """Rows of the comparison table for one example."""
    rows = []
    repeats = sorted({r for _, r in figs})
    for n0 in sizes:
        for n in sizes:
            sources = [figs[(n0, r)] for r in repeats if (n0, r) in figs]
            targets = [figs[(n, r)] for r in repeats if (n, r) in figs]
            if not sources or not targets:
                continue
            preds = [predict_one(f, n) for f in sources]
            p_med = statistics.median(p.samples_per_s for p in preds)
            m_med = statistics.median(t.samples_per_s for t in targets)
            paired, oracle, inside = [], [], 0
            for r in repeats:
                if (n0, r) not in figs or (n, r) not in figs:
                    continue
                src, tgt = figs[(n0, r)], figs[(n, r)]
                guess = predict_one(src, n)
                paired.append(_err(guess.samples_per_s, tgt.samples_per_s))
                inside += guess.low <= tgt.samples_per_s <= guess.high
                told = background_threads(tgt)[0]
                oracle.append(_err(predict_one(src, n, told).samples_per_s,
                                   tgt.samples_per_s))
            lo = statistics.median(p.low for p in preds)
            hi = statistics.median(p.high for p in preds)
            rows.append([f"{n0} -> {n}", f"{p_med:,.1f} [{lo:,.0f}, {hi:,.0f}]",
                         f"{m_med:,.1f}", _pct(_err(p_med, m_med)),
                         f"{_pct(statistics.median(paired))} "
                         f"({_pct(min(paired))} .. {_pct(max(paired))})",
                         f"{inside}/{len(paired)}", _pct(statistics.median(oracle))])
    return rows


def report(out: Path, names: dict[str, dict[tuple[int, int], str]], sizes: list[int]) -> None:
    """Print each example's table and the runs' backgrounds; keep the figures as JSON."""
    store = out / "tandem.db"
    dump = {}
    for example, by_key in names.items():
        figs = {key: run_figures(store, name) for key, name in by_key.items()}
        header = ["run N0 -> N", "predicted samples/s [interval]", "measured",
                  "error (medians)", "paired error (range)", "in interval",
                  "oracle-load error"]
        print(f"\n{example}\n")
        print(table(header, compare(figs, sizes)))
        for n in sizes:
            runs = [figs[k] for k in sorted(figs) if k[0] == n]
            text = ", ".join(f"{f.samples_per_s:,.1f} (bg {background_threads(f)[0]:.1f})"
                             for f in runs)
            print(f"  measured at {n}: {text}")
        dump[example] = {f"{k[0]}-{k[1]}": asdict(f) for k, f in figs.items()}
    (out / "figures.json").write_text(json.dumps(dump, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--mnist-steps", type=int, default=EXAMPLES["mnist1d_cnn"][1])
    parser.add_argument("--lm-steps", type=int, default=EXAMPLES["char_lm"][1])
    parser.add_argument("--out", default=None, help="keep the runs here (default: temp)")
    parser.add_argument("--report-only", action="store_true",
                        help="only compare the runs already in --out")
    args = parser.parse_args()
    if args.report_only and not args.out:
        parser.error("--report-only compares the runs stored in --out: give --out DIR")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.steps = {"mnist1d_cnn": args.mnist_steps, "char_lm": args.lm_steps}
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.report_only:
            names = {ex: {(n, r): f"{ex}-n{n}-r{r}" for n in args.sizes
                          for r in range(args.repeats)} for ex in args.examples}
        else:
            names = run_all(args, out)
        report(out, names, args.sizes)
    print(f"\nload average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
