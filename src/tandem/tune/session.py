"""The tuner: measure the job, diagnose it, test changes in paired runs, pick a plan.

The order of work (each step real runs of the user's script, see `trial.py`):

1. **The job's settings** are resolved without training (`TrialRunner.resolve`).
2. **Baseline** A0 under the current plan: its measurements (`measure.py`) size the
   candidates (`sizing.py`) and its diagnosis names the bottleneck. Sized in seconds
   (the default, `runsize.py`), A0 is a probe stopped once it has run long enough, and
   its seconds per step size every later run, so that a slow job's runs cost what a fast
   one's do.
3. **Placebo**: the current plan against itself, PLACEBO_FIRST pairs first (A0 the first
   reference); its further pairs, up to --placebo-pairs, are interleaved with the
   candidates' (one before each candidate pair after the first). Its pairs count in the
   pooled noise every interval is taken with; when its interval shows a bias (two runs
   of one plan differing systematically), every decision's lower bound must clear that
   bias too (`stats.noise_floor`). The k-th candidate spends 2^-k of the session's error
   rate (`stats.py`).
4. **Candidates**: the user's own (--try) first, in their order; then the tuner's,
   largest predicted gain first (`proposals.by_predicted_gain`: the smells and
   measured candidates carry one), then each diagnosed family after its control
   experiment (`controls.py`): a refuted family, or one whose control cannot gain
   1 + min_gain, is skipped (a mixture's other shares, `mixing.py`, are judged by the
   time to every task's target); where nothing is proposed, the plan's priced
   neighbours (`explore.py`), so that a well-configured job's "nothing" is a verdict.
   Each candidate is an arm against the current plan, in
   pairs of runs with alternating order, judged after each pair by a sequential test
   (`stats.judge`): it wins (lower bound at the look's confidence over the floor, from
   its first pair on: an effect that dwarfs the noise is decided at once), stops (upper
   bound under the floor) or gets another pair, up to max_pairs. Candidates the budget
   or --max-trials never reached are recorded as such. A lossy candidate must also pass
   the convergence guardrail (`guard.py`),
   checked on its first pair: one that trains worse is rejected there. A
   winner becomes the plan later arms are measured against; its last run is measured
   and diagnosed again, and its proposals join the queue.
5. **Judged again**: at the end every adoption is judged once more with the session's
   final noise (the arms after it may have shown the machine noisier than when it won);
   one whose lower bound no longer clears the floor is revoked, with every adoption
   measured on top of it (`Bench.rejudge`).
6. **The claim**: one adoption's interval is against the original plan already; after
   several, the chosen plan is measured against the original in pairs when the budget
   allows (else the adopted ratios are combined).

Every run, control and decision goes to the run store's tune_trials table under the tune
session's own run id (`tandem report <session>`), with its runs, medians, interval and
the placebo's spread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem.analyze.diagnosis.diagnose import Finding, diagnose_run
from tandem.monitor.store import RunStore, environment
from tandem.status import RunStatus
from tandem.tune import controls, explore, guard, mixing, runsize, sizing, smells, space
from tandem.tune import stats as tstats
from tandem.tune.arms import PLACEBO, Arm, Bench, evidence_text
from tandem.tune.measure import Measured, measured_from
from tandem.tune.outcome import Record, Settings, TuneResult, session_id
from tandem.tune.proposals import by_predicted_gain, predicted_text, proposals
from tandem.tune.space import Candidate
from tandem.tune.trial import RunOutcome, TrialRunner

log = logging.getLogger("tandem")
__all__ = ["Record", "Settings", "TuneResult", "Tuner", "session_id"]


class Tuner:
    """Runs one tune session of `runner`'s script."""

    def __init__(self, runner: TrialRunner, settings: Settings, session: str,
                 extra: Sequence[Candidate] = (),
                 echo: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.clock = clock  # the budget's seconds (a simulated runner keeps its own)
        self.s = settings
        self.session = session
        self.extra = list(extra)
        self.echo = echo or (lambda text: log.info("%s", text))
        self.records: list[Record] = []
        self.trials = 0
        self.started = clock()
        self.incumbent: dict[str, Any] = {}
        self.job: dict[str, Any] = {}
        self.tried: set[tuple[tuple[str, str], ...]] = set()
        self.futile: set[str] = set()  # families a control ruled out
        self.evidence: dict[str, str] = {}
        self.findings: list[Finding] = []
        self.measured: Measured | None = None
        self.adopted: list[Arm] = []
        self.validations: dict[str, dict[str, Any]] = {}
        self.targets = mixing.parse_targets(settings.task_targets)  # else the baseline's
        self.bench = Bench(self._launch, settings.min_gain, settings.confidence, lambda run:
                           {**run.figures, **mixing.figure(run, self.targets)})
        self.a0: RunOutcome | None = None
        self.judged: set[tuple[tuple[str, str], ...]] = set()  # candidates' own changes
        self.speed: tstats.Interval | None = None
        self.run_s = settings.run_s or runsize.auto_run_seconds(settings.budget_s)
        self.pace = runsize.Pace()  # seconds per step of each plan that was current
        self.stretch: dict[tuple[tuple[str, str], ...], float] = {}  # arm -> predicted
        self.unreached: list[Candidate] = []
        self.smells: list[smells.Smell] = []

    # ------------------------------------------------------------------ record
    def _store(self) -> RunStore:
        return RunStore(self.runner.store_path)

    def _record(self, label: str, kind: str, status: str, changes: Mapping[str, Any],
                figures: dict[str, Any], decision: str) -> Record:
        rec = Record(f"{len(self.records):02d}", label, kind, status, dict(changes), figures,
                     decision)
        self.records.append(rec)
        with self._store() as store:
            store.log_trial(self.session, rec.trial_id, rec.changes, status,
                            {"label": label, "kind": kind, **figures}, decision)
        self.echo(f"[{rec.trial_id}] {label}: {status} - {decision}")
        return rec

    # ------------------------------------------------------------------ timing
    def _elapsed(self) -> float:
        return self.clock() - self.started

    def _run_estimate(self) -> float:
        walls = [r.wall_s for a in self.bench.arms for p in a.pairs
                 for r in (p.arm, p.reference)] + ([self.a0.wall_s] if self.a0 else [])
        # A quarter over the typical run: one run slowed by a neighbour must not end the
        # session, nor may a typical run overshoot the budget.
        return 1.25 * statistics.median(walls) if walls else 60.0

    def _can_afford(self, runs: int) -> bool:
        return self._elapsed() + runs * self._run_estimate() <= self.s.budget_s

    def _launch(self, tag: str, changes: Mapping[str, Any], control: str) -> RunOutcome:
        name = f"{self.session}-{self.runner.runs:03d}-{tag}"
        sized = None if self.s.steps else self.pace.size(
            self._key(changes), self._key(self.incumbent), self.run_s,
            self.stretch.get(self._key(changes), 1.0))
        steps, log_every = ((sized.steps, sized.log_every) if sized else
                            (self.s.steps or runsize.MIN_STEPS, self.s.log_every))
        out = self.runner.run(name, changes, steps, log_every, control)
        if tag == PLACEBO:  # between pairs: a pair's two runs share their window size
            self.pace.follow(self._key(changes), out.windows)
        return out

    def _probe(self) -> RunOutcome:
        """The baseline run: fixed steps, or (sized in seconds) stopped once its windows
        span enough time to size every later run (`runsize.probe_done`)."""
        if self.s.steps:
            return self._launch("baseline", {}, "")
        name = f"{self.session}-{self.runner.runs:03d}-baseline"
        out = self.runner.run(name, {}, runsize.PROBE_STEPS, self.s.log_every, watch=lambda:
                              runsize.probe_done(self.runner.read(name).windows, self.run_s))
        if out.stopped and len(out.windows) >= 2:
            out.ok, out.error = True, ""
        elif out.stopped:
            out.ok, out.error = False, out.error or "stopped before two logging windows"
        return out

    # ------------------------------------------------------------------ session
    def run(self) -> TuneResult:
        """Tune; record everything in the store; return the chosen plan."""
        with self._store() as store:
            store.start_run(self.session, f"tune-{Path(self.runner.script).stem}",
                            {"tune": vars(self.s), "script": self.runner.script,
                             "script_args": self.runner.script_args,
                             "nproc": self.runner.nproc},
                            dict(self.runner.base_plan),
                            environment(world_size=self.runner.nproc))
        status = RunStatus.FAILED
        try:
            result = self._tune()
            status = RunStatus.COMPLETED
            return result
        finally:
            summary = self._summary() if status == RunStatus.COMPLETED else {"trials": self.trials}
            with self._store() as store:
                store.finish_run(self.session, status, summary)

    def _tune(self) -> TuneResult:
        # Each run's timeout is capped by the budget left, never below a run's worth
        self.runner.deadline = self.started + self.s.budget_s
        self.runner.min_timeout_s = runsize.min_timeout(self.run_s)
        self.job = self.runner.resolve()
        if self.job.get("monitor.log_every"):
            self.runner.job_log_every = int(self.job["monitor.log_every"])
        a0 = self._probe()
        if not a0.ok:
            self._record("baseline", "baseline", "failed", {}, {"error": a0.error},
                         f"the current plan did not run: {a0.error}")
            raise RuntimeError(f"the baseline run failed: {a0.error}")
        self.a0, self.targets = a0, self.targets or mixing.baseline_targets(a0)
        self._measure(a0)
        self._placebo(a0)
        queue = list(self.extra) + self._proposals()
        assert self.measured is not None  # nothing proposed: the nearest neighbours
        self._drain(queue or explore.near_misses(self.measured, {**self.job}))
        return self._result()

    def _measure(self, outcome: RunOutcome) -> None:
        """Measure and diagnose one run of the current plan; record it the first time."""
        with self._store() as store:
            run = store.run(outcome.run_id)
            metrics = store.metrics(outcome.run_id)
            findings = diagnose_run(run, metrics, store.events(outcome.run_id))
        ran = space.flatten(run["config"] or {})
        config = {**self.job, **ran}
        for key in ("monitor.log_every", "checkpoint.at_end", "monitor.calibrate_at"):
            if key in self.job:  # what the trial set for itself is not the job's
                config[key] = self.job[key]
        config.update(self.incumbent)
        self.pace.note(self._key(self.incumbent), outcome.windows)
        self.measured = measured_from(metrics, run.get("summary") or {}, config,
                                      outcome.windows, self.runner.nproc,
                                      int(ran.get("monitor.log_every") or 1),
                                      {**os.environ, **self.runner.env})
        self.measured = dataclasses.replace(self.measured, sample_s=self.runner.sample_s)
        kinds = space.acted_on()
        self.smells = smells.smells(self.measured)
        self.findings = ([f for f in findings if f.kind in kinds]
                         + [smell.finding() for smell in self.smells])
        if outcome is self.a0:
            self._record("baseline", "baseline", "measured", {}, {
                "runs": [outcome.run_id], "wall_s": outcome.wall_s, "run": outcome.figures,
                "measured": sizing.describe(self.measured),
                "findings": [{"kind": f.kind, "severity": f.severity, "message": f.message,
                              "predicted_speedup": controls.predicted_of(f)}
                             for f in self.findings]},
                "diagnosis: " + ("; ".join(f"{f.evidence.get('smell', f.kind)} ({f.severity})"
                                           for f in self.findings) or "nothing to judge"))

    def _placebo(self, a0: RunOutcome) -> None:
        """The first PLACEBO_FIRST A/A pairs (A0 the first reference); the rest, up to
        --placebo-pairs, are interleaved with the candidates' pairs (`_more_placebo`), each
        recorded with the placebo's figures so far."""
        arm = self.bench.add(Arm("placebo (A/A)", PLACEBO, {}, {}))
        # A0 stands for the first pair's reference, a probe (sized in seconds) too: the
        # same plan, so whatever its other length does to its figure only widens the
        # noise the placebo measures (its pairs count around zero), never a gain.
        error = self.bench.pair(arm, reference_run=a0)
        while not error and len(arm.pairs) < min(PLACEBO_FIRST, self.s.placebo_pairs):
            error = self.bench.pair(arm)
        self._record_placebo(error)

    def _record_placebo(self, error: str = "") -> None:
        """Record the placebo with all its pairs so far: one row when it is measured
        first, one more after each interleaved pair (the record stays in time order)."""
        arm = self.bench.placebo
        assert arm is not None
        figures = {**self.bench.record(arm), "reason": "the current plan against itself"}
        if (rate := self.bench.placebo_rate()) is not None:
            figures["samples_per_s"] = rate.as_dict()
        self._record(arm.label, PLACEBO, "failed" if error else "measured", {}, figures,
                     f"this machine's noise: {evidence_text(figures)}"
                     + (f"; a run failed ({error})" if error else ""))

    def _more_placebo(self) -> None:
        """One more A/A pair, while the placebo has fewer than --placebo-pairs."""
        arm = self.bench.placebo
        if arm is None or len(arm.pairs) >= self.s.placebo_pairs or not self._can_afford(4):
            return
        self._record_placebo(self.bench.pair(arm))

    def _proposals(self) -> list[Candidate]:
        """Measured candidates, then each diagnosed family behind its control."""
        assert self.measured is not None
        return proposals(self.smells, self.measured, self.findings,
                         {**self.job, **self.incumbent}, self.s.min_gain)

    def _drain(self, queue: list[Candidate]) -> None:
        """Try the queue in order; after each adoption, the new measurements' ideas."""
        while queue and self._budget_left():
            cand = queue.pop(0)
            if not self._controlled(cand.family):
                continue
            if self._candidate(cand, last=not queue):
                queue[:] = [c for c in queue if not set(c.changes) & set(cand.changes)]
                fresh = [c for c in self._proposals() if not self._was_tried(c)]
                queue[:] = by_predicted_gain(fresh + queue)
        self._unreached([c for c in queue if not self._was_tried(c)])

    def _unreached(self, queue: list[Candidate]) -> None:
        """Say which candidates the session never reached, and why."""
        why = ("--max-trials reached" if self.trials >= self.s.max_trials
               else "no budget left for a pair")
        for cand in queue:
            self._not_reached(cand, why)

    def _not_reached(self, cand: Candidate, why: str, figures: Mapping[str, Any] = {}
                     ) -> None:
        self.unreached.append(cand)
        self._record(cand.label, "candidate", "not-reached", cand.changes,
                     {**figures, "reason": cand.reason, "predicted": cand.predicted,
                      "family": cand.family},
                     f"never tried ({why}); {predicted_text(cand.predicted)}")

    def _budget_left(self) -> bool:
        return self.trials < self.s.max_trials and self._can_afford(2)

    def _was_tried(self, cand: Candidate) -> bool:
        """Judged before (under an earlier plan): not proposed again."""
        return self._key(cand.changes) in self.judged

    @staticmethod
    def _key(changes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, repr(v)) for k, v in changes.items()))

    # ------------------------------------------------------------------ controls
    def _controlled(self, family: str) -> bool:
        """Run the family's control once (when a finding names one); False: skip it."""
        finding = space.families_of(self.findings).get(family)
        if finding is None or family in self.validations:
            return family not in self.futile
        control = space.control_of(finding)
        if not control:
            return True
        if not self._can_afford(4):
            self.validations[family] = {"state": "inconclusive", "control": control,
                                        "reason": "no budget left for the control"}
            self._record(f"control:{control}", "control", "skipped", {},
                         {"reason": "no budget"}, f"no budget left for the control: "
                         f"{family} changes are tried without it")
            return True
        self.trials += 1
        pairs = next(k for k in range(max(self.s.control_pairs, 2), 1, -1)
                     if k == 2 or self._can_afford(2 * k))
        result = controls.validate(
            self.runner, finding, pairs=pairs, reference=self.incumbent,
            job=self.job, bench=self.bench, placebo_pairs=self.s.placebo_pairs,
            min_gain=self.s.min_gain)
        self.validations[family] = result
        iv = result.get("interval")
        if result["state"] == "refuted" or (iv and iv[1] < 1 + self.s.min_gain):
            self.futile.add(family)
            verdict = f"{family} changes skipped"
        else:
            verdict = f"{family} changes are worth trying"
        figures = {**(result.get("evidence") or {}),
                   **{k: v for k, v in result.items() if k != "evidence"}}
        self._record(f"control:{control}", "control", result["state"], {}, figures,
                     f"{result['reason']} ({evidence_text(figures)}): {verdict}")
        return family not in self.futile

    # ------------------------------------------------------------------ candidates
    def _candidate(self, cand: Candidate, last: bool = False) -> bool:
        """Try one candidate in paired runs; True when it was adopted. The last one in
        the queue may take the pairs the budget left affords (`runsize.last_pairs`)."""
        changes = {**self.incumbent, **cand.changes}
        if changes == self.incumbent or self._key(changes) in self.tried:
            return False
        self.tried.add(self._key(changes))
        self.judged.add(self._key(cand.changes))
        info = {"reason": cand.reason, "lossy": cand.lossy, "predicted": cand.predicted,
                "family": cand.family}
        problem = space.check(self.job, changes, self.runner.nproc)
        if problem:
            self._record(cand.label, "candidate", "invalid", cand.changes, info,
                         f"not a valid config here: {problem}")
            return False
        self.trials += 1
        # the k-th candidate spends 2^-k of the session's error rate (`stats.py`)
        arm = self.bench.add(Arm(cand.label, "candidate", changes, dict(self.incumbent),
                                 share=0.5 ** self.trials, figure=cand.figure))
        if cand.predicted:
            self.stretch[self._key(changes)] = cand.predicted
        verdict, error, guard_verdict = "more", "", None
        max_pairs = (runsize.last_pairs(self.s.budget_s - self._elapsed(), self._run_estimate(),
                                        self.s.max_pairs) if last else self.s.max_pairs)
        while verdict == "more":
            if arm.pairs:
                self._more_placebo()
            if not self._can_afford(2):
                verdict = "budget"
                break
            error = self.bench.pair(arm)
            if error:
                break
            if cand.lossy and guard_verdict is None:
                # Its first pair already tells whether it trains as well: a change that
                # diverges is rejected before any more runs are spent on its speed.
                guard_verdict = self._guard(arm, changes)
                if not guard_verdict.ok:
                    verdict = "diverged"
                    break
            verdict = self.bench.judge(arm, tstats.MIN_PAIRS, max_pairs)
        figures = {**self.bench.record(arm), **info}
        if "ratio" in figures:
            figures["measured"] = figures["ratio"]["estimate"]
        if guard_verdict is not None:
            figures["guard"] = guard_verdict.as_dict()
        ev = f"{predicted_text(cand.predicted)}, measured {evidence_text(figures)}"
        floor = f"{self.bench.floor(arm.figure):.3g}"
        if error and arm.failure is not None and arm.failure.budget_cut:
            self._not_reached(cand, f"the budget ran out during its pair: {error}",
                              {**figures, "error": error})
            return False
        if error:
            self._record(cand.label, "candidate", "failed", cand.changes,
                         {**figures, "error": error}, f"a run failed: {error}")
            return False
        if verdict == "diverged":
            assert guard_verdict is not None
            self._record(cand.label, "candidate", "rejected", cand.changes, figures,
                         f"{ev}; fails the convergence guardrail: {guard_verdict.reason}")
            return False
        if verdict != "win":
            status, why = {
                "lose": ("stopped-early", f"cannot clear the noise floor {floor}"),
                "undecided": ("not-significant", f"lower bound not above the floor {floor}"),
                "budget": ("not-significant", "no budget left for another pair")}[verdict]
            self._record(cand.label, "candidate", status, cand.changes, figures,
                         f"{ev}: {why}")
            return False
        self._record(cand.label, "candidate", "adopted", cand.changes, figures,
                     f"{ev}: lower bound above the floor {floor}"
                     + ("; guardrail passed" if cand.lossy else ""))
        for key in cand.changes:
            self.evidence[key] = f"{cand.reason}; trial {self.records[-1].trial_id}: {ev}"
        self.incumbent = changes
        self.adopted.append(arm)
        self._measure(arm.pairs[-1].arm)
        return True

    def _guard(self, arm: Arm, changes: Mapping[str, Any]) -> guard.GuardResult:
        """The convergence guardrail on the arm's first pair (same steps, same seed), or
        on dedicated runs of --guard-steps."""
        first = arm.pairs[0]
        base_run, cand_run = first.reference, first.arm
        steps = self.s.guard_steps or self.s.steps
        if self.s.guard_steps and steps != self.s.steps:  # dedicated runs over its steps
            base_run = self.runner.run(f"{self.session}-{self.runner.runs:03d}-guard-base",
                                       self.incumbent, steps, self.s.log_every)
            cand_run = self.runner.run(f"{self.session}-{self.runner.runs:03d}-guard-cand",
                                       changes, steps, self.s.log_every)
        return guard.compare(base_run.losses, cand_run.losses)

    # ------------------------------------------------------------------ result
    def _speedup(self) -> tstats.Interval | None:
        if not self.adopted:
            return None
        if len(self.adopted) == 1:
            return self.bench.interval(self.adopted[0], "wall")  # samples/s, as claimed
        arm = self.bench.add(Arm("chosen vs original", "confirm", dict(self.incumbent), {}))
        while len(arm.pairs) < tstats.MIN_PAIRS + 1 and self._can_afford(2):
            if self.bench.pair(arm):
                break
        if len(arm.pairs) >= tstats.MIN_PAIRS:
            figures = self.bench.record(arm)
            self._record(arm.label, "confirm", "measured", self.incumbent, figures,
                         f"the chosen plan against the original: {evidence_text(figures)}")
            return self.bench.interval(arm)
        parts = [iv for a in self.adopted if (iv := self.bench.interval(a)) is not None]
        sd, df = self.bench.noise("wall")
        return tstats.combine(parts, sd, df, self.s.confidence)

    def _rejudge(self) -> None:
        """Judge the adoptions again with the session's final noise; revoke those whose
        lower bound no longer clears the floor (and those adopted on top of them)."""
        kept, revoked = self.bench.rejudge(self.adopted)
        if not revoked:
            return
        sd, df = self.bench.noise("wall")
        floor = f"{self.bench.floor('wall'):.3g}"
        for arm in revoked:
            own = {k: v for k, v in arm.changes.items() if arm.reference.get(k) != v}
            figures = self.bench.record(arm)
            self._record(arm.label, "candidate", "revoked", own, figures,
                         f"judged again with the session's final noise (pair sd "
                         f"{sd:.1%}, {df} df): {evidence_text(figures)}: lower bound not "
                         f"above the floor {floor}" if arm is revoked[0] else
                         f"adopted on top of a revoked change: {evidence_text(figures)}")
            for key in own:
                self.evidence.pop(key, None)
        self.adopted = kept
        self.incumbent = dict(kept[-1].changes) if kept else {}

    def _result(self) -> TuneResult:
        # The placebo completed to --placebo-pairs where the budget allows: the final
        # judgement then has all the noise the user asked for.
        arm = self.bench.placebo
        while arm is not None and len(arm.pairs) < self.s.placebo_pairs \
                and self._can_afford(2):
            before = len(arm.pairs)
            self._more_placebo()
            if len(arm.pairs) == before:
                break
        self._rejudge()
        self.speed = self._speedup()
        return TuneResult(
            session_id=self.session, changes=dict(self.incumbent), records=self.records,
            trials=self.trials, wall_s=self._elapsed(), speedup=self.speed,
            findings=self.findings, baseline=self.bench.placebo_rate(), evidence=self.evidence,
            noise=self.bench.noise_record("wall"))

    def _summary(self) -> dict[str, Any]:
        speed = self.speed
        return {"chosen": dict(self.incumbent), "trials": self.trials,
                "runs": self.runner.runs, "wall_s": self._elapsed(),
                "speedup": speed.as_dict() if speed else None,
                "evidence": self.evidence, "noise": self.bench.noise_record("wall"),
                "unreached": [c.label for c in self.unreached],
                "run_s": None if self.s.steps else self.run_s,
                "startup": self.bench.startups(),
                "validations": {k: {x: y for x, y in v.items() if x != "evidence"}
                                for k, v in self.validations.items()}}


PLACEBO_FIRST = 2  # A/A pairs before any candidate: the least that gives a noise estimate
