"""`tandem tune --hparams`: search hyper-parameters for the time to reach train.target.

Optuna drives the search: a TPE sampler proposes, a MedianPruner stops trials whose
evaluations lag the median of earlier trials at the same step. Each trial is a real run
of the script (`trial.py`'s command, with `train.eval_every` set so the target is
checked during the run); the tuner reads its evaluations from the run store while it
runs and reports the distance to the target to Optuna at each evaluation.

Objective (seconds, minimised): the run's time to target (`summary.time_to_target_s`);
a run that does not reach it scores PENALTY x its training time, so a miss is always
worse than a hit within the same run length.

Search space, only over keys present in the config at run time:

* learning-rate multiplier m in [1/4, 4] (log): `optim.lr_scaling = "linear"` with
  `optim.reference_batch = round(global_batch / m)` - the task's lr is scaled by m;
* `optim.schedule` constant / warmup_cosine / onecycle, with `optim.warmup_steps` in
  [0, steps / 5] for warmup_cosine and `optim.pct_start` in [0.1, 0.5] for onecycle;
* `train.global_batch` x 1/2, 1 or 2 (kept >= the process count).

The best trial is adopted only when the same run-level statistics as the plan tuner's
confirm it (`arms.py`): the current settings against themselves (a placebo of
PLACEBO_PAIRS pairs) and the best trial's settings against the current ones in pairs of
runs with alternating order, the figure being 1 / time to target; adopted when the
lower bound of its speed-up clears the noise floor (`stats.noise_floor`: 1 + min_gain,
or the placebo's bias when it shows one). A best trial that one run each shows no
faster than 1 + min_gain is not confirmed at all.

The study lives in the run store's own SQLite file (Optuna's tables beside tandem's,
`optuna.load_study(study_name=SESSION, storage="sqlite:///runs/tandem.db")`). Every trial
is also mirrored to the run store's tune_trials table under the session's run id.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tandem.config import parse_target
from tandem.monitor.store import RunStore, environment
from tandem.status import RunStatus
from tandem.tables import print_fitted
from tandem.tune import planfile
from tandem.tune import stats as tstats
from tandem.tune.arms import PLACEBO, Arm, Bench, evidence_text
from tandem.tune.common import decision_table, parse_duration, runner_from
from tandem.tune.outcome import Record, TuneResult, session_id
from tandem.tune.space import flatten, known_keys
from tandem.tune.trial import RunOutcome, TrialRunner

PENALTY = 2.0
PLACEBO_PAIRS = 2
HPARAMS_STEPS = 60  # steps of every trial when --steps is 0 (a search compares runs of equal steps)


def space(trial: Any, global_batch: int, steps: int, world: int) -> dict[str, Any]:
    """The changes one Optuna trial proposes (see the module docstring)."""
    keys = known_keys()
    changes: dict[str, Any] = {}
    if {"optim.lr_scaling", "optim.reference_batch"} <= keys:
        scale = trial.suggest_float("lr_multiplier", 0.25, 4.0, log=True)
        changes["optim.lr_scaling"] = "linear"
        changes["optim.reference_batch"] = max(1, round(global_batch / scale))
    if "optim.schedule" in keys:
        schedule = trial.suggest_categorical("schedule",
                                             ["constant", "warmup_cosine", "onecycle"])
        changes["optim.schedule"] = schedule
        if schedule == "warmup_cosine":
            changes["optim.warmup_steps"] = trial.suggest_int("warmup_steps", 0,
                                                              max(1, steps // 5))
        if schedule == "onecycle":
            changes["optim.pct_start"] = round(trial.suggest_float("pct_start", 0.1, 0.5), 3)
    if "train.global_batch" in keys:
        factor = trial.suggest_categorical("batch_factor", [0.5, 1.0, 2.0])
        batch = max(world, int(global_batch * factor) // world * world)
        changes["train.global_batch"] = batch
        if "optim.reference_batch" in changes:  # the multiplier is of the task's own lr
            changes["optim.reference_batch"] = max(
                1, round(changes["optim.reference_batch"] * batch / global_batch))
    return changes


def objective_of(summary: dict[str, Any]) -> tuple[float, bool]:
    """(seconds to minimise, whether the target was reached) from a run's summary."""
    reached = summary.get("time_to_target_s")
    if reached is not None:
        return float(reached), True
    train_s = float(summary.get("wall_time_s") or 0.0)
    return PENALTY * max(train_s, 1e-3), False


def target_rate(run: RunOutcome) -> dict[str, float]:
    """A run's figure for the paired comparison: {'target': 1 / objective seconds}."""
    seconds, _ = objective_of(run.summary)
    return {"target": 1.0 / seconds} if seconds > 0 else {}


def confirm(runner: TrialRunner, session: str, base_run: RunOutcome, changes: dict[str, Any],
            steps: int, log_every: int, eval_every: int, min_gain: float, max_pairs: int,
            budget_left: Any) -> tuple[bool, dict[str, Any]]:
    """Paired runs of `changes` against the current settings, with a placebo;
    (adopt, evidence record). `budget_left(runs)` says whether that many runs still fit."""
    def launch(tag: str, plan: Any, control: str) -> RunOutcome:
        return runner.run(f"{session}-r{runner.runs:03d}-{tag}", plan, steps, log_every,
                          eval_every=eval_every)

    bench = Bench(launch, min_gain, figure_of=target_rate)
    placebo = bench.add(Arm("placebo (A/A)", PLACEBO, {}, {}, figure="target"))
    error = bench.pair(placebo, reference_run=base_run)
    while not error and len(placebo.pairs) < PLACEBO_PAIRS and budget_left(2):
        error = bench.pair(placebo)
    arm = bench.add(Arm("best", "candidate", changes, {}, figure="target"))
    verdict = "more"
    while not error and verdict == "more" and budget_left(2):
        error = bench.pair(arm)
        verdict = bench.judge(arm, tstats.MIN_PAIRS, max_pairs) if not error else verdict
    record = bench.record(arm)
    record["placebo_runs"] = [p.arm.run_id for p in placebo.pairs]
    record["verdict"] = verdict if not error else f"failed: {error}"
    return verdict == "win" and not error, record


def _distance(value: float, op: str, goal: float) -> float:
    return goal - value if op == ">=" else value - goal


def _run_pruned(runner: TrialRunner, name: str, changes: dict[str, Any], steps: int,
                log_every: int, eval_every: int, trial: Any, target: tuple[str, str, float]
                ) -> tuple[RunOutcome, bool]:
    """Run one trial, reporting its evaluations to Optuna as they land; (outcome, pruned)."""
    metric, op, goal = target
    reported: set[int] = set()

    def watch() -> bool:
        for step, value in _evaluations(runner.store_path, name, metric):
            if step not in reported and math.isfinite(value):
                reported.add(step)
                trial.report(_distance(value, op, goal), step)
                if trial.should_prune():
                    return True
        return False

    outcome = runner.run(name, changes, steps, log_every, eval_every=eval_every, watch=watch)
    return outcome, outcome.stopped


def _evaluations(store_path: Path, name: str, metric: str) -> list[tuple[int, float]]:
    if not store_path.is_file():
        return []
    with RunStore(store_path) as store:
        try:
            rid = store.run(name)["run_id"]
        except ValueError:
            return []
        return [(m["step"], m["value"]) for m in store.metrics(rid, name=metric)]


def run(ns: argparse.Namespace, console: Console) -> int:
    """`tandem tune --hparams ...`: returns the exit status."""
    try:
        import optuna  # noqa: F401 - needed by the search, checked before any run
    except ImportError:
        raise ValueError("--hparams needs Optuna: pip install -e '.[tune]'") from None
    budget = parse_duration(ns.budget)
    runner = runner_from(ns)
    session = session_id(ns.script) + "-hp"
    started = time.monotonic()
    steps = ns.steps or HPARAMS_STEPS  # time-to-target needs the same steps in every trial
    records: list[Record] = []

    def record(tid: str, label: str, status: str, changes: dict, figures: dict,
               decision: str) -> None:
        rec = Record(tid, label, "hparams", status, changes, figures, decision)
        records.append(rec)
        with RunStore(runner.store_path) as store:
            store.log_trial(session, tid, changes, status,
                            {"label": label, "kind": "hparams", **figures}, decision)
        console.print(f"[{tid}] {label}: {status} - {decision}", highlight=False,
                      markup=False)

    with RunStore(runner.store_path) as store:
        store.start_run(session, f"tune-{Path(ns.script).stem}",
                        {"tune": {"mode": "hparams", "budget_s": budget, "steps": steps,
                                  "n_trials": ns.n_trials}, "script": runner.script,
                         "script_args": runner.script_args, "nproc": runner.nproc},
                        dict(runner.base_plan), environment(world_size=runner.nproc))
    try:
        result = _search(ns, runner, session, record, records, started, budget)
    except BaseException as err:
        _finish(runner, session, RunStatus.FAILED, {"error": f"{type(err).__name__}: {err}"})
        raise
    path = planfile.write(Path(ns.out), planfile.render(result, ns.script, runner.nproc,
                                                        str(runner.store_path), ns.min_gain))
    print_fitted(console, decision_table(records, f"hparams session {session}"),
                 spill=("decision",))
    console.print(result.decision, highlight=False, markup=False)
    console.print(f"plan written to {path}; Optuna study {session!r} in "
                  f"{runner.store_path}")
    return 0


def _search(ns: argparse.Namespace, runner: TrialRunner, session: str, record: Any,
            records: list[Record], started: float, budget: float) -> TuneResult:
    """The baseline, then the Optuna study; the session is closed by the caller."""
    import optuna

    steps, log_every = ns.steps or HPARAMS_STEPS, ns.log_every
    eval_every = max(1, steps // 6)
    # The current hyper-parameters first: the reference, and the config to search around.
    base = runner.run(f"{session}-r000-baseline", {}, steps, log_every, eval_every=eval_every)
    if not base.ok:
        raise RuntimeError(f"the baseline run failed: {base.error}")
    with RunStore(runner.store_path) as store:
        config = store.run(base.run_id)["config"]
    if not config["train"]["target"]:
        raise ValueError("--hparams minimises the time to train.target; set it, e.g. "
                         "--train.target 'accuracy>=0.9'")
    target = parse_target(config["train"]["target"])
    base_value, base_hit = objective_of(base.summary)
    record("00", "baseline", "measured", {}, {"objective_s": base_value, "reached": base_hit,
                                                 "runs": [base.run_id]},
           f"time to target {base_value:.2f} s" if base_hit else
           f"target not reached in {steps} steps (penalised {base_value:.2f} s)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{runner.store_path}")
    study = optuna.create_study(
        study_name=session, storage=storage, direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=eval_every))
    global_batch = int(config["train"]["global_batch"])

    objective = _objective(runner, session, record, global_batch, steps, log_every,
                           eval_every, target, base_value)

    def stop_when_spent(study: Any, trial: Any) -> None:
        if time.monotonic() - started + max(base.wall_s, 1.0) > budget:
            study.stop()

    study.optimize(objective, n_trials=ns.n_trials, callbacks=[stop_when_spent],
                   catch=(Exception,))
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(done, key=lambda t: t.value) if done else None
    changes, evidence, speedup, decision = _choose(
        ns, runner, session, record, records, base, best, flatten(config), eval_every,
        lambda runs: time.monotonic() - started + runs * max(base.wall_s, 1.0) <= budget)
    result = TuneResult(session_id=session, changes=changes, records=records,
                        trials=len(study.trials), wall_s=time.monotonic() - started,
                        speedup=speedup, findings=[], baseline=None, evidence=evidence,
                        decision=decision)
    _finish(runner, session, RunStatus.COMPLETED, {"chosen": changes, "trials": len(study.trials),
                                          "wall_s": result.wall_s,
                                          "best_objective_s": best.value if best else None,
                                          "baseline_objective_s": base_value,
                                          "evidence": evidence, "decision": decision})
    return result


def _objective(runner: TrialRunner, session: str, record: Any, global_batch: int, steps: int,
               log_every: int, eval_every: int, target: tuple[str, str, float],
               base_value: float) -> Any:
    """Optuna's objective: one pruned trial run, recorded; its time to target."""
    import optuna

    def objective(trial: Any) -> float:
        changes = space(trial, global_batch, steps, runner.nproc)
        tid = f"{trial.number + 1:02d}"
        label = ", ".join(f"{k}={v}" for k, v in changes.items())
        out, pruned = _run_pruned(runner, f"{session}-r{trial.number + 1:03d}", changes,
                                  steps, log_every, eval_every, trial, target)
        figures = {"runs": [out.run_id], "params": trial.params, "wall_s": out.wall_s}
        if pruned:
            record(tid, label, "pruned", changes, figures,
                   "its evaluations lag the median of earlier trials (MedianPruner)")
            raise optuna.TrialPruned()
        if not out.ok:
            record(tid, label, "failed", changes, {**figures, "error": out.error},
                   f"the trial failed: {out.error}")
            raise optuna.TrialPruned()  # a failure must not stop the study
        value, hit = objective_of(out.summary)
        trial.set_user_attr("changes", changes)
        record(tid, label, "complete", changes,
               {**figures, "objective_s": value, "reached": hit},
               (f"time to target {value:.2f} s" if hit else
                f"target not reached (penalised {value:.2f} s)")
               + f"; baseline {base_value:.2f} s")
        return value

    return objective


def _choose(ns: argparse.Namespace, runner: TrialRunner, session: str, record: Any,
            records: list[Record], base: RunOutcome, best: Any, current: dict[str, Any],
            eval_every: int, budget_left: Any
            ) -> tuple[dict[str, Any], dict[str, str], tstats.Interval | None, str]:
    """The best trial's changes, confirmed in paired runs: (changes, evidence, speed-up,
    the decision in words); nothing when one run each shows no gain of 1 + min_gain or the
    pairs do not confirm."""
    base_value, _ = objective_of(base.summary)
    if best is None:
        return {}, {}, None, "keep the current settings: no trial completed"
    bar = base_value * (1 - ns.min_gain)
    if best.value >= bar:
        return {}, {}, None, (
            f"keep the current settings: the best trial ({best.number + 1:02d}, "
            f"{best.value:.2f} s) was not under {bar:.2f} s (the current settings' "
            f"{base_value:.2f} s less {ns.min_gain:.0%}) in its one run; nothing to confirm")
    wanted = {k: v for k, v in best.user_attrs["changes"].items() if current.get(k) != v}
    adopt, figures = confirm(runner, session, base, best.user_attrs["changes"], ns.steps,
                             ns.log_every, eval_every, ns.min_gain, ns.max_pairs, budget_left)
    ev = evidence_text(figures)
    record(f"{len(records):02d}", f"confirm trial {best.number + 1:02d}",
           "adopted" if adopt else "not-significant", wanted, {**figures, "kind": "confirm"},
           f"time to target in paired runs: {ev}"
           + ("" if adopt else f" ({figures['verdict']})"))
    if not adopt:
        return {}, {}, None, (f"keep the current settings: trial {best.number + 1:02d} "
                              f"({best.value:.2f} s in one run) was not confirmed in paired "
                              f"runs ({figures['verdict']}): {ev}")
    why = (f"hparams trial {best.number + 1:02d}: time to target {best.value:.2f} s vs "
           f"{base_value:.2f} s for the current settings; confirmed: {ev}")
    return (wanted, dict.fromkeys(wanted, why), tstats.Interval(**figures["ratio"]),
            f"adopt trial {best.number + 1:02d}: {ev}")


def _finish(runner: TrialRunner, session: str, status: str, summary: dict) -> None:
    with RunStore(runner.store_path) as store:
        store.finish_run(session, status, summary)
