"""The `tandem` command: run, config, runs, report, compare, plan, tune, scheduler, compress,
dashboard."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tandem.config import reference
from tandem.launcher import command as launch
from tandem.monitor.store import add_store_argument
from tandem.tables import print_fitted


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem", description="Run, measure and compare tandem training runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="launch a script on this node (and others) via torchrun")
    launch.add_arguments(run)
    sub.add_parser("config", help="list every config option with its default")
    runs = sub.add_parser("runs", help="list (filter, delete) the runs in the run store")
    from tandem.monitor.runs_cli import add_arguments as runs_arguments

    runs_arguments(runs)
    add_store_argument(runs)
    report = sub.add_parser("report", help="summarise a run and write its HTML report")
    report.add_argument("run", nargs="?", default=None,
                        help="run id, unique id prefix, or run name (default: the latest run)")
    report.add_argument("--out", "--html", dest="out", default=None,
                        help="report file (default: report.html in the run's folder)")
    report.add_argument("--validate", action="store_true",
                        help="first run each finding's control experiment (paired runs of "
                             "the job without the cause, against an A/A placebo) and "
                             "record the outcome")
    report.add_argument("--pairs", type=int, default=3,
                        help="--validate: at most this many pairs of runs per control")
    report.add_argument("--steps", type=int, default=40,
                        help="--validate: steps of each control run")
    report.add_argument("--log-every", type=int, default=5,
                        help="--validate: steps per logging window of each control run")
    add_store_argument(report)
    compare = sub.add_parser("compare", help="set runs side by side (table and HTML)")
    compare.add_argument("runs", nargs="+", help="two or more runs")
    compare.add_argument("--out", "--html", dest="out", default=None,
                         help="comparison file (default: in the first run's folder)")
    add_store_argument(compare)
    plan = sub.add_parser("plan", help="which layouts fit a model on a machine, how fast each "
                          "would step (predicted, before anything runs)")
    from tandem.planner.command import add_arguments as plan_arguments

    plan_arguments(plan)
    tune = sub.add_parser("tune", help="pick the execution plan by short validation trials")
    from tandem.tune.command import add_arguments as tune_arguments

    tune_arguments(tune)
    scheduler = sub.add_parser("scheduler", help="the job scheduler service (--backend "
                               "local|ray|slurm), or `simulate` a workload")
    from tandem.sched.service.command import add_arguments as scheduler_arguments

    scheduler_arguments(scheduler)
    compress = sub.add_parser("compress", help="weigh compressed versions of a run's model "
                              "against it and export the smallest within an accuracy budget")
    from tandem.compress.command import add_arguments as compress_arguments

    compress_arguments(compress)
    dashboard = sub.add_parser("dashboard", help="serve a live web view of the run store")
    from tandem.dashboard.command import add_arguments as dashboard_arguments

    dashboard_arguments(dashboard)
    from tandem.sched.service.jobs_cli import add_arguments as jobs_arguments

    jobs_arguments(sub)
    return parser


def _open_store(given: str | None):  # noqa: ANN202 - RunStore, imported lazily
    from tandem.monitor.store import RunStore, store_location

    path = store_location(given)
    if not path.is_file():
        raise ValueError(f"--store: no run store at {path!r}; runs write one to "
                         "<run.dir>/tandem.db")
    return RunStore(path)


def _list_runs(ns: argparse.Namespace, console: Console) -> int:
    from tandem.monitor.runs_cli import run

    with _open_store(ns.store) as store:
        return run(ns, store, console)


def _report(ns: argparse.Namespace, console: Console) -> None:
    from tandem.analyze.report.run_report import print_summary, write_html
    from tandem.monitor.runs_cli import output_path

    with _open_store(ns.store) as store:
        chosen = store.run(ns.run) if ns.run else store.latest_run()
        run_id = chosen["run_id"]
        if ns.validate:
            _validate(store, run_id, ns, console)
        print_summary(store, run_id, console)
        out = Path(ns.out) if ns.out else output_path(store, chosen, "report.html")
        path = write_html(store, run_id, out)
    console.print(f"report written to {path}", highlight=False)


def _validate(store: Any, run_id: str, ns: argparse.Namespace,
              console: Console) -> None:
    from tandem.analyze.report.run_report import findings_of
    from tandem.tune.controls import validate_run

    if ns.pairs < 2 or ns.steps < 2 * ns.log_every:
        raise ValueError(f"--validate needs --pairs >= 2 (got {ns.pairs}) and --steps at "
                         f"least two windows of --log-every {ns.log_every} (got {ns.steps})")
    # A confirmed or refuted finding is settled; an inconclusive one is measured again.
    findings = [f for f in findings_of(store, run_id)
                if (f.validation or {}).get("state") not in ("confirmed", "refuted")]
    work = store.path.parent / "validate" / run_id
    done = validate_run(store.path, run_id, findings, work, pairs=ns.pairs, steps=ns.steps,
                        log_every=ns.log_every, say=console.print)
    if not done:
        console.print("no finding to validate: none predicts a gain that a control "
                      "experiment can check, or each was confirmed or refuted before")


def _compare(ns: argparse.Namespace, console: Console) -> None:
    from tandem.analyze.report.run_report import compare, compare_table
    from tandem.monitor.runs_cli import output_path

    with _open_store(ns.store) as store:
        chosen = [store.run(name) for name in ns.runs]
        ids = [r["run_id"] for r in chosen]
        print_fitted(console, compare_table(store, ids), letters=True)
        others = "-".join(r["name"] for r in chosen[1:])[:80]
        out = (Path(ns.out) if ns.out
               else output_path(store, chosen[0], f"compare-with-{others}.html"))
        path = compare(store, ids, out)
    console.print(f"comparison written to {path}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `tandem` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "submit":  # its options may follow the script's own flags
        from tandem.sched.service.jobs_cli import submit_main

        return _usage_errors(lambda: submit_main(argv[1:]))
    ns = _parser().parse_args(argv)
    console = Console()
    try:
        if ns.command == "run":
            return launch.launch(ns)
        elif ns.command == "config":
            print(reference())
        elif ns.command == "runs":
            return _list_runs(ns, console)
        elif ns.command == "report":
            _report(ns, console)
        elif ns.command == "compare":
            _compare(ns, console)
        elif ns.command == "plan":
            from tandem.planner.command import main as plan

            return plan(ns)
        elif ns.command == "tune":
            from tandem.tune.command import run as tune

            return tune(ns, console)
        elif ns.command == "scheduler":
            from tandem.sched.service.command import run as scheduler

            return scheduler(ns, console)
        elif ns.command == "compress":
            from tandem.compress.command import run as compress

            return compress(ns, console)
        elif ns.command == "dashboard":
            from tandem.dashboard.command import run as dashboard

            return dashboard(ns)
        elif ns.command in ("queue", "cancel", "logs"):
            from tandem.sched.service.jobs_cli import run as jobs

            return jobs(ns, console)
    except ValueError as err:
        print(f"tandem: error: {err}", file=sys.stderr)
        return 2
    return 0


def _usage_errors(fn: Callable[[], int]) -> int:
    try:
        return fn()
    except ValueError as err:
        print(f"tandem: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
