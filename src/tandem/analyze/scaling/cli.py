"""`python -m tandem.analyze.scaling.model RUN`: a run's predicted throughput by size."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict

from tandem.analyze.scaling.inputs import run_figures
from tandem.analyze.scaling.model import Prediction, RunFigures, background_threads, predict
from tandem.monitor.store import add_store_argument, store_location


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: a comma-separated list of "
                                         "process counts >= 1, e.g. 1,2,4")
    return sizes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tandem.analyze.scaling.model",
        description="Predict a run's samples/s at other process counts on its machine.")
    parser.add_argument("run", help="run id, name or id prefix")
    add_store_argument(parser)
    parser.add_argument("--sizes", type=_sizes, default=[1, 2, 4],
                        help="process counts to predict (default 1,2,4)")
    parser.add_argument("--background", type=float, default=None,
                        help="foreign CPU-bound threads to assume (0: a dedicated machine; "
                             "default: as the run measured)")
    parser.add_argument("--cores", type=int, default=None,
                        help="cores of the machine (default: what the run recorded)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def table(fig: RunFigures, predictions: dict[int, Prediction]) -> str:
    """The predictions as a text table, with the run's own measurement above it."""
    middle, lo, hi = background_threads(fig)
    lines = [f"run {fig.run_id}: {fig.world_size} process(es), {fig.samples_per_s:,.1f} "
             f"samples/s measured; {fig.cores} cores, background {middle:.2f} foreign "
             f"threads ({lo:.2f}-{hi:.2f} over its windows)",
             f"{'N':>3} {'micro x k':>9} {'samples/s':>10} {'interval':>17} {'step ms':>8} "
             f"{'compute':>8} {'data':>6} {'optim':>6} {'other':>6} {'wire':>6} "
             f"{'wait':>6} {'share':>5}"]
    for n, p in predictions.items():
        ms = {k: v * 1e3 for k, v in p.breakdown.items()}
        lines.append(
            f"{n:>3} {f'{p.micro_batch} x {p.accum}':>9} {p.samples_per_s:>10,.1f} "
            f"{f'{p.low:,.1f}-{p.high:,.1f}':>17} {p.step_s * 1e3:>8.1f} "
            f"{ms['compute']:>8.1f} {ms['data']:>6.1f} {ms['optim']:>6.1f} "
            f"{ms['other']:>6.1f} {ms['wire']:>6.1f} {ms['wait']:>6.1f} {p.cpu_share:>5.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the predictions for one run; 2 on a usage error."""
    args = _parser().parse_args(argv)
    try:
        fig = run_figures(store_location(args.store), args.run, cores=args.cores)
        predictions = predict(fig, args.sizes, background=args.background)
    except ValueError as err:
        print(f"error: {err}")
        return 2
    if args.json:
        print(json.dumps({"run_id": fig.run_id, "measured_samples_per_s": fig.samples_per_s,
                          "world_size": fig.world_size,
                          "predictions": {str(n): {**asdict(p), "breakdown": p.breakdown}
                                          for n, p in predictions.items()}}, indent=2))
    else:
        print(table(fig, predictions))
    return 0
