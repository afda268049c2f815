"""The `tandem compress` subcommand's options; the experiment itself is
`tandem.compress.experiment` (imported when the command runs: the command line starts
without torch)."""

from __future__ import annotations

import argparse

from rich.console import Console

from tandem.monitor.store import add_store_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The subcommand's options."""
    parser.add_argument("run", help="a run directory, or a run's name or id in the store")
    parser.add_argument("--budget", type=float, required=True,
                        help="how much worse than the original the adopted model may be: "
                             "percentage points of a metric that goes up (accuracy), or the "
                             "own units of one that goes down (a loss); 0 is a placebo")
    parser.add_argument("--out", required=True, help="folder for model.pt2 and compress.json")
    parser.add_argument("--script", default=None,
                        help="the training script (default: the one the run store recorded)")
    parser.add_argument("--task", default=None,
                        help="the script's module-level Task by name (default: its only one)")
    parser.add_argument("--metric", default=None,
                        help="the task's metric to hold (default: the one the run's "
                             "train.target names, else accuracy, else the task's first "
                             "metric, else eval_loss)")
    parser.add_argument("--steps", type=int, default=100,
                        help="fine-tuning steps of each candidate that needs them")
    parser.add_argument("--lr-scale", type=float, default=0.3,
                        help="the task optimizer's learning rates times this, for fine-tuning")
    parser.add_argument("--distill", type=float, default=0.0,
                        help="fine-tunes learn from the original as a teacher: the "
                             "distillation term's ratio (T 2; 0: off)")
    parser.add_argument("--seed", type=int, default=0, help="the fine-tunes' first seed")
    parser.add_argument("--seeds", type=int, default=1,
                        help="make each candidate with this many seeds: its metric is their "
                             "mean, and with 2 or more the worse end of its 95%% interval "
                             "must be within the budget")
    parser.add_argument("--prefer", choices=("size", "speed"), default="size",
                        help="adopt the smallest eligible model, or the fastest at batch 64")
    parser.add_argument("--repeats", type=int, default=5,
                        help="latency measurements per model and batch size (median taken)")
    add_store_argument(parser, " (for a run directory: the tandem.db beside it)")



def run(ns: argparse.Namespace, console: Console) -> int:
    """Run the compression experiment the options ask for."""
    from tandem.compress.experiment import run as experiment

    return experiment(ns, console)
