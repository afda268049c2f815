"""Control experiments: check a finding's claim by removing its cause in real runs.

A performance finding names a cause and predicts what removing it would gain
(`Finding.predicted_speedup`: step time over step time without the cause). Its control
(`Finding.control`) removes the cause outright, however no real change could:

* ``NO_COMM``: the same job with no gradient communication: plan.strategy localsgd
  whose replicas never meet during the run (sync_every beyond it, a multiple of the
  checkpoint cadence), no comm hook, no link calibration.
* ``IN_MEMORY_DATA``: the same job with its training samples served from memory
  (`shim.py`: the first items loaded once and reused), so loading costs nothing.

The control is an arm against the job's plan (`arms.py`): interleaved pairs of runs,
the run as the unit, the session's A/A placebo as its noise (`validate` measures one
when it is not given a Bench that has it). The figure is the step's throughput
('step': training time only), since the prediction is about the step.

Decision rule, with p the predicted speed-up, [lo, hi] the measured interval and floor
the noise floor (`stats.noise_floor`: 1 + min_gain, or the placebo's bias when it shows one):

* **refuted**: hi < 1 + (p - 1) / 2: even the upper bound gives less than half the
  predicted gain (without a prediction: hi < 1 + min_gain, no gain worth having);
* **confirmed**: lo > floor (the gain is real, beyond this machine's noise) and the
  prediction lies within the interval widened by TOLERANCE on each side:
  lo / (1 + TOLERANCE) <= p <= hi x (1 + TOLERANCE) (without a prediction: lo > floor);
* **inconclusive**: anything else (too few pairs to tell, or a real gain of a size the
  prediction does not match: the "reason" says which).

Pairs are added one at a time from MIN_PAIRS up to `pairs` and stop once the state is
confirmed or refuted.

API (used by the tuner, and by `tandem report --validate`):

    from tandem.tune.controls import validate, runner_for_run
    runner = runner_for_run(store_path, run_id, work_dir)   # or a TrialRunner of the job
    result = validate(runner, finding, pairs=3, steps=40, log_every=5)
    # {"state": "confirmed" | "refuted" | "inconclusive", "predicted": x | None,
    #  "measured": y, "interval": [lo, hi], "runs": n, "pairs": n,
    #  "noise": {"pair_sd", "df", "placebo", "placebo_pairs", "floor", ...},
    #  "control": "no_comm" | "in_memory_data", "reason": "..."}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem.analyze.diagnosis.diagnose import IN_MEMORY_DATA, NO_COMM
from tandem.analyze.diagnosis.finding import VALIDATION_PREFIX
from tandem.monitor.store import RunStore
from tandem.parallel import registry as strategies
from tandem.tune import stats
from tandem.tune.arms import PLACEBO, Arm, Bench
from tandem.tune.space import DATA_CONTROL, control_of, flatten
from tandem.tune.trial import RunOutcome, TrialRunner

TOLERANCE = 0.15
MIN_PAIRS = 2
PLACEBO_PAIRS = 2
BEYOND_RUN = 1_000_000  # meetings this far apart never happen in a trial
# Settings a control run cannot keep from the job: run identity and store, set per trial.
RUN_KEYS = ("run.name", "run.dir", "run.resume", "monitor.store", "monitor.progress",
            "monitor.report")


def predicted_of(finding: Any) -> float | None:
    """The finding's predicted speed-up: its own, else step / (step - phase) from its
    evidence (None when neither is there)."""
    value = getattr(finding, "predicted_speedup", None)
    if value is not None and math.isfinite(value) and value > 0:
        return float(value)
    evidence = getattr(finding, "evidence", {}) or {}
    step, phase = evidence.get("step_s"), evidence.get("phase_s")
    if isinstance(step, int | float) and isinstance(phase, int | float) and 0 <= phase < step:
        return step / (step - phase)
    return None


def control_arm(control: str, job: Mapping[str, Any], reference: Mapping[str, Any]
                ) -> tuple[dict[str, Any], str] | None:
    """(changes, launcher control) of a control over the reference plan (None: the job's
    plan has no such control, e.g. tensor parallelism for NO_COMM)."""
    plan = {**job, **reference}
    if control == IN_MEMORY_DATA:
        return dict(reference), DATA_CONTROL
    if control == NO_COMM:
        if int(plan.get("plan.tp", 1) or 1) > 1:
            return None
        every = int(plan.get("checkpoint.every") or 0)
        sync = every * math.ceil(BEYOND_RUN / every) if every else BEYOND_RUN
        changes = {**reference, "plan.strategy": strategies.LOCALSGD.name, "plan.comm_hook": "none",
                   "plan.sync_every": sync, "monitor.calibrate_at": 0}
        if plan.get("fault.nonfinite") == "rollback":  # localsgd refuses it; no timing role
            changes["fault.nonfinite"] = "skip"
        return changes, ""
    return None


def classify(predicted: float | None, iv: stats.Interval, floor: float,
             min_gain: float = stats.MIN_GAIN) -> tuple[str, str]:
    """(state, reason) by the module's rule."""
    lo, hi = iv.low, iv.high
    if predicted is None:
        if hi < 1 + min_gain:
            return "refuted", f"removing the cause gains at most {hi:.3g}x"
        if lo > floor:
            return "confirmed", f"removing the cause gains at least {lo:.3g}x (noise floor " \
                                f"{floor:.3g})"
        return "inconclusive", f"[{lo:.3g}, {hi:.3g}] does not clear the noise floor " \
                               f"{floor:.3g}"
    if hi < 1 + (predicted - 1) / 2:
        return "refuted", (f"predicted {predicted:.3g}x; even the upper bound {hi:.3g}x is "
                           "below half the predicted gain")
    covered = lo / (1 + TOLERANCE) <= predicted <= hi * (1 + TOLERANCE)
    if lo > floor and covered:
        return "confirmed", (f"predicted {predicted:.3g}x, measured [{lo:.3g}, {hi:.3g}] "
                             f"(within {TOLERANCE:.0%}); beyond the noise floor {floor:.3g}")
    if lo > floor:
        side = "more" if lo / (1 + TOLERANCE) > predicted else "less"
        return "inconclusive", (f"a real gain [{lo:.3g}, {hi:.3g}], but {side} than the "
                                f"predicted {predicted:.3g}x")
    return "inconclusive", (f"[{lo:.3g}, {hi:.3g}] does not clear the noise floor "
                            f"{floor:.3g}; predicted {predicted:.3g}x")


def bench_for(runner: TrialRunner, steps: int, log_every: int,
              min_gain: float = stats.MIN_GAIN, prefix: str = "validate") -> Bench:
    """A Bench whose runs are trial runs of `runner`'s job."""
    def launch(tag: str, changes: Mapping[str, Any], control: str) -> RunOutcome:
        return runner.run(f"{prefix}-{runner.runs:03d}-{tag}", changes, steps, log_every,
                          control)

    return Bench(launch, min_gain)


def ensure_placebo(bench: Bench, reference: Mapping[str, Any], pairs: int) -> Arm:
    """The bench's placebo arm, with at least `pairs` pairs (run here when missing)."""
    arm = bench.placebo or bench.add(Arm(PLACEBO, PLACEBO, dict(reference), dict(reference)))
    while len(arm.pairs) < pairs:
        if bench.pair(arm):
            break
    return arm


def validate(runner: TrialRunner, finding: Any, *, pairs: int = 3, steps: int = 40,
             log_every: int = 5, reference: Mapping[str, Any] | None = None,
             job: Mapping[str, Any] | None = None, bench: Bench | None = None,
             placebo_pairs: int = PLACEBO_PAIRS, min_gain: float = stats.MIN_GAIN
             ) -> dict[str, Any]:
    """Run `finding`'s control experiment against the job's plan; the validation dict.

    `runner` launches the job (a TrialRunner: script, its flags, processes, store).
    `reference`: plan changes the comparison is made under (default: none). `job`: the
    job's resolved flat settings (default: resolved from the script). `bench`: a Bench
    whose placebo and pairs give the noise (default: a new one, with `placebo_pairs`
    A/A pairs measured first). Never raises for a failed run: the state is then
    'inconclusive' and the reason says why.
    """
    control = control_of(finding)
    predicted = predicted_of(finding)
    reference = dict(reference or {})
    base = {"predicted": predicted, "control": control or None, "runs": 0, "pairs": 0,
            "measured": None, "interval": None}
    job = dict(job) if job is not None else runner.resolve()
    made = control_arm(control, job, reference) if control else None
    if made is None:
        return {**base, "state": "inconclusive", "noise": None,
                "reason": f"no control experiment for {finding.kind} under this plan"}
    bench = bench or bench_for(runner, steps, log_every, min_gain)
    ensure_placebo(bench, reference, placebo_pairs)
    changes, launcher = made
    arm = bench.add(Arm(f"control:{control}", "control", changes, reference, launcher,
                        figure="step"))
    state, reason, failed = "inconclusive", "no pair measured", ""
    while len(arm.pairs) < max(pairs, 1):
        failed = bench.pair(arm)
        if failed:
            break
        iv = bench.interval(arm)
        assert iv is not None
        state, reason = classify(predicted, iv, bench.floor("step"), min_gain)
        if len(arm.pairs) >= MIN_PAIRS and state != "inconclusive":
            break
    iv = bench.interval(arm)
    record = bench.record(arm)
    if failed:
        reason = f"{reason}; a run failed: {failed}"
    return {**base, "state": state, "reason": reason,
            "measured": iv.estimate if iv else None,
            "interval": [iv.low, iv.high] if iv else None,
            "pairs": len(arm.pairs), "runs": 2 * len(arm.pairs),
            "noise": record["noise"], "evidence": record}


def runner_for_run(store_path: str | Path, run_id: str, work_dir: str | Path,
                   timeout_s: float = 300.0, trial_store: str | Path | None = None
                   ) -> TrialRunner:
    """A TrialRunner that relaunches a recorded run's job: its script, its process count
    and its whole resolved config as the plan (run identity and store aside). Its runs go
    to `trial_store` (default: the run's own store)."""
    with RunStore(Path(store_path)) as store:
        run = store.run(run_id)
    env, config = run.get("env") or {}, run.get("config") or {}
    script = env.get("script")
    if not script or not Path(script).is_file():
        raise ValueError(f"run {run_id!r}: its script {script!r} is not on this machine")
    plan = {k: v for k, v in flatten(config).items() if k not in RUN_KEYS}
    return TrialRunner(script=str(script), script_args=[],
                       nproc=int(env.get("world_size") or 1), work_dir=Path(work_dir),
                       store_path=Path(trial_store or store_path), base_plan=plan,
                       timeout_s=timeout_s)


def validate_run(store_path: str | Path, run_id: str, findings: Sequence[Any],
                 work_dir: str | Path, *, pairs: int = 3, steps: int = 40,
                 log_every: int = 5, timeout_s: float = 300.0,
                 say: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Run the control experiment of each finding that predicts a gain and has one, and
    record each outcome in the store as trial 'validate:<kind>' of run `run_id` (what
    `tandem report` then shows). One placebo serves them all. The trial runs go to their
    own store in `work_dir`, so that they never pass for the user's runs. Outcomes by kind.
    """
    todo = [f for f in findings if f.control and predicted_of(f) is not None]
    if not todo:
        return {}
    work = Path(work_dir)
    runner = runner_for_run(store_path, run_id, work, timeout_s, work / "trials.db")
    job = runner.resolve()
    bench = bench_for(runner, steps, log_every)
    out: dict[str, dict[str, Any]] = {}
    for finding in todo:
        say(f"validating {finding.kind}: predicted {predicted_of(finding):.2f}x if removed; "
            f"control {finding.control}, up to {pairs} pairs of {steps}-step runs "
            f"(after {PLACEBO_PAIRS} placebo pairs)")
        result = validate(runner, finding, pairs=pairs, steps=steps, log_every=log_every,
                          job=job, bench=bench)
        result.pop("evidence", None)
        with RunStore(Path(store_path)) as store:
            store.log_trial(run_id, VALIDATION_PREFIX + finding.kind,
                            {"control": finding.control}, result["state"], result)
        say(f"  {result['state']}: {result['reason']}")
        out[finding.kind] = result
    return out
