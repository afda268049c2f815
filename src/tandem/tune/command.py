"""`tandem tune`: its flags, the session, the plan file and the table at the end."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from tandem.monitor.store import add_store_argument
from tandem.tables import print_fitted
from tandem.tune import planfile, space
from tandem.tune import stats as tstats
from tandem.tune.common import decision_table, parse_duration, runner_from
from tandem.tune.session import Settings, Tuner, TuneResult, session_id
from tandem.tune.trial import warm_workers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tandem tune`."""
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="processes of every trial run")
    parser.add_argument("--budget", default="10m",
                        help="wall time for the whole session: 90s, 10m, 1h (default 10m)")
    parser.add_argument("--out", default="plan.toml", help="the plan file written at the end")
    add_store_argument(parser, " for the trials and the decision record")
    parser.add_argument("--work-dir", default="runs/tune",
                        help="where trial runs, their plan files and logs go")
    parser.add_argument("--max-trials", type=int, default=10,
                        help="controls and candidates to run at most")
    parser.add_argument("--steps", type=int, default=0,
                        help="steps of each trial run (0, the default: runs sized in "
                             "seconds, see --run-seconds)")
    parser.add_argument("--run-seconds", type=float, default=0.0,
                        help="seconds of training per trial run when --steps is 0 (0: a "
                             "thirtieth of the budget, within 4-30 s)")
    parser.add_argument("--log-every", type=int, default=5,
                        help="steps per logging window (one throughput figure each; with "
                             "runs sized in seconds, the baseline's)")
    parser.add_argument("--min-gain", type=float, default=tstats.MIN_GAIN,
                        help="a change must be faster by more than this, outside the noise")
    parser.add_argument("--placebo-pairs", type=int, default=3,
                        help="A/A pairs of the current plan that measure this machine's "
                             "noise (at least 2)")
    parser.add_argument("--max-pairs", type=int, default=tstats.MAX_PAIRS,
                        help="paired runs a candidate gets at most before it is judged "
                             "not significant (the queue's last candidate: as many as the "
                             "budget left affords, up to 8)")
    parser.add_argument("--guard-steps", type=int, default=0,
                        help="steps of the convergence guardrail (0: the trial runs' own)")
    parser.add_argument("--trial-timeout", type=float, default=300.0,
                        help="seconds before a trial run is killed and recorded as hung")
    parser.add_argument("--cold", action="store_true",
                        help="start every trial's workers cold (default: forked warm from "
                             "a fork server the session starts)")
    parser.add_argument("--try", dest="tries", action="append", default=[],
                        metavar="KEY=VALUE[,KEY=VALUE]",
                        help="a candidate to try first (repeatable)")
    parser.add_argument("--task-target", dest="task_targets", action="append", default=[],
                        metavar="'task/NAME/METRIC>=V'",
                        help="a mixture's task goal (repeatable): other shares of the "
                             "mixture are judged by the time to every one (default: each "
                             "task's eval_loss where the baseline run ended)")
    parser.add_argument("--plan", default=None,
                        help="the current plan file, if the job already runs with one")
    parser.add_argument("--hparams", action="store_true",
                        help="search hyper-parameters for time to train.target (Optuna)")
    parser.add_argument("--n-trials", type=int, default=20,
                        help="--hparams: Optuna trials at most")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's own flags (--section.field VALUE ...)")


def run(ns: argparse.Namespace, console: Console) -> int:
    """`tandem tune ...`: returns the exit status."""
    if ns.hparams:
        from tandem.tune import hparams

        return hparams.run(ns, console)
    settings = Settings(budget_s=parse_duration(ns.budget), max_trials=ns.max_trials,
                        steps=ns.steps, log_every=ns.log_every, min_gain=ns.min_gain,
                        run_s=ns.run_seconds,
                        guard_steps=ns.guard_steps, placebo_pairs=ns.placebo_pairs,
                        max_pairs=ns.max_pairs, task_targets=tuple(ns.task_targets))
    if settings.placebo_pairs < 2:
        raise ValueError(f"--placebo-pairs {settings.placebo_pairs}: at least 2 pairs are "
                         "needed to measure the noise")
    if settings.max_pairs < tstats.MIN_PAIRS:
        raise ValueError(f"--max-pairs {settings.max_pairs}: at least {tstats.MIN_PAIRS}")
    if settings.steps < 0 or settings.run_s < 0:
        raise ValueError(f"--steps {settings.steps} and --run-seconds {settings.run_s} "
                         "must be >= 0 (0: sized in seconds, from the budget)")
    if settings.steps and settings.steps < 2 * settings.log_every:
        raise ValueError(f"--steps {settings.steps} must give at least two logging windows "
                         f"of --log-every {settings.log_every} steps")
    extra = [space.parse_try(t) for t in ns.tries]
    runner = runner_from(ns)
    session = session_id(ns.script)
    console.print(f"tandem tune: session {session}, {runner.nproc} process(es), budget "
                  f"{settings.budget_s:.0f} s, at most {settings.max_trials} trials")
    tuner = Tuner(runner, settings, session, extra,
                  echo=lambda line: console.print(line, highlight=False, markup=False))
    with warm_workers(runner, enabled=not ns.cold):
        result = tuner.run()
    text = planfile.render(result, ns.script, runner.nproc, str(runner.store_path),
                           settings.min_gain)
    path = planfile.write(Path(ns.out), text)
    print_fitted(console, decision_table(result.records, f"tune session {session}"),
                 spill=("decision",))
    console.print(summary_line(result, runner.runs))
    console.print(f"plan written to {path} (use: tandem run --plan {path} ...)")
    return 0


def summary_line(result: TuneResult, runs: int) -> str:
    """One line: what was chosen, how much faster, at what cost."""
    if result.changes:
        chosen = ", ".join(f"{k}={v}" for k, v in result.changes.items())
        speed = f" ({result.speedup.text()}x the baseline)" if result.speedup else ""
        head = f"chosen: {chosen}{speed}"
    else:
        head = "chosen: keep the current plan"
    unreached = [r.label for r in result.records if r.status == "not-reached"]
    return (f"{head}; {result.trials} trial(s), {runs} run(s), "
            f"{result.wall_s:.0f} s of tuning"
            + (f"; never reached: {', '.join(unreached)}" if unreached else ""))
