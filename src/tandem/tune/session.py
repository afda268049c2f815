"""The tuner: measure the current plan, diagnose it, run validation trials, pick a plan.

The order of work (each step a real run of the user's script, see `trial.py`):

1. **Baseline** A0 under the current plan; its diagnosis names the bottleneck.
2. **Controls** for the families the diagnosis names (`space.py`): one run each that
   bounds what the family can gain. A family whose bound cannot reach 1 + min_gain is
   skipped without trying its members.
3. **Candidates**, the diagnosis' first, each in two stages. Stage 1 is one run; it
   stops there when it clearly cannot win (its throughput interval lies below the
   baseline's, or the ratio interval lies below 1 + min_gain). Stage 2 runs it again
   and then re-measures the baseline (A/B/A); the candidate is compared with the
   baseline runs that bracket it (`stats.ratio_interval`). It wins when the ratio's
   lower bound exceeds 1 + min_gain; a lossy winner must also pass the convergence
   guardrail (`guard.py`). A winner becomes the new plan that later candidates build
   on, and its latest run is diagnosed again: the bottleneck may have moved.
4. **Search**: when the diagnosis' candidates are spent and the budget allows, every
   other family's candidates, in the same two-stage way.

Every run, control and decision goes to the run store's trials table under the tune
session's own run id, so `tandem report <session>` shows the decision record.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.analyze.diagnose import Finding, diagnose
from tandem.monitor.store import RunStore, environment
from tandem.tune import guard, space
from tandem.tune import stats as tstats
from tandem.tune.space import Candidate
from tandem.tune.trial import RunOutcome, TrialRunner

log = logging.getLogger("tandem")


@dataclass
class Settings:
    """How hard the tuner looks."""

    budget_s: float = 600.0
    max_trials: int = 10
    steps: int = 60  # steps of each trial run
    log_every: int = 5  # steps per logging window (one throughput figure each)
    min_gain: float = tstats.MIN_GAIN
    confidence: float = tstats.CONFIDENCE
    guard_steps: int = 0  # 0: the trial runs' own steps


@dataclass
class Record:
    """One line of the decision record."""

    trial_id: str
    label: str
    kind: str  # baseline, control, candidate
    status: str  # measured, bound, skipped, stopped-early, not-significant, rejected,
    #              adopted, failed, invalid
    changes: dict[str, Any]
    figures: dict[str, Any]
    decision: str


@dataclass
class TuneResult:
    """What a tune session found."""

    session_id: str
    changes: dict[str, Any]  # the chosen plan over the original one ({} = keep it)
    records: list[Record]
    trials: int
    wall_s: float
    speedup: tstats.Interval | None
    findings: list[Finding]
    baseline: tstats.Interval | None
    evidence: dict[str, str] = field(default_factory=dict)  # key -> why


def session_id(script: str) -> str:
    """'tune-train-20240601-120000'."""
    return f"tune-{Path(script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


class Tuner:
    """Runs one tune session of `runner`'s script."""

    def __init__(self, runner: TrialRunner, settings: Settings, session: str,
                 extra: Sequence[Candidate] = (),
                 echo: Callable[[str], None] | None = None) -> None:
        self.runner = runner
        self.s = settings
        self.session = session
        self.extra = list(extra)
        self.echo = echo or (lambda text: log.info("%s", text))
        self.records: list[Record] = []
        self.trials = 0
        self.started = time.monotonic()
        self.incumbent: dict[str, Any] = {}
        self.reference: list[RunOutcome] = []  # runs of the incumbent plan, in order
        self.original: list[RunOutcome] = []  # runs of the plan we started from
        self.tried: set[tuple[tuple[str, str], ...]] = set()
        self.futile: set[str] = set()  # families a control showed cannot gain enough
        self.evidence: dict[str, str] = {}
        self.base_flat: dict[str, Any] = {}
        self.findings: list[Finding] = []

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
        return time.monotonic() - self.started

    def _run_estimate(self) -> float:
        walls = [r.wall_s for r in self.original + self.reference if r.wall_s > 0]
        return max(walls) if walls else 60.0

    def _can_afford(self, runs: int) -> bool:
        return self._elapsed() + runs * self._run_estimate() <= self.s.budget_s

    def _run(self, tag: str, changes: Mapping[str, Any], control: str = "",
             steps: int | None = None) -> RunOutcome:
        name = f"{self.session}-{self.runner.runs:03d}-{tag}"
        return self.runner.run(name, changes, steps or self.s.steps, self.s.log_every, control)

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
        status = "failed"
        try:
            result = self._tune()
            status = "completed"
            return result
        finally:
            summary = self._summary() if status == "completed" else {"trials": self.trials}
            with self._store() as store:
                store.finish_run(self.session, status, summary)

    def _tune(self) -> TuneResult:
        a0 = self._run("baseline", {})
        if not a0.ok:
            self._record("baseline", "baseline", "failed", {}, {"error": a0.error},
                         f"the current plan did not run: {a0.error}")
            raise RuntimeError(f"the baseline run failed: {a0.error}")
        self.original = [a0]
        self.reference = [a0]
        self.findings = self._diagnose(a0)
        self.base_flat = self._config_of(a0)
        self._record("baseline", "baseline", "measured", {},
                     {**self._figures([a0]), "findings": [
                         {"kind": f.kind, "severity": f.severity, "message": f.message}
                         for f in self.findings]},
                     "diagnosis: " + ("; ".join(f"{f.kind} ({f.severity})"
                                                for f in self.findings) or "nothing to judge"))
        self._drain(list(self.extra))  # asked for by name: before anything else
        controls, queue = self._plan_work()
        for control in controls:
            if not self._budget_left():
                break
            self._control(control)
        self._drain(queue)
        if self._budget_left():
            self._drain(space.remaining({**self.base_flat, **self.incumbent},
                                        self.runner.nproc, os.cpu_count() or 1))
        return self._result()

    def _plan_work(self) -> tuple[list[Candidate], list[Candidate]]:
        return space.from_findings(self.findings, self.base_flat, self.runner.nproc,
                                   os.cpu_count() or 1)

    def _drain(self, queue: list[Candidate]) -> None:
        """Try the queue in order; after each adoption, the new diagnosis' ideas first."""
        while queue and self._budget_left():
            cand = queue.pop(0)
            if self._candidate(cand):
                # Ideas for the keys just changed were made for the old plan: drop them;
                # the new diagnosis proposes them afresh, relative to the new plan.
                queue[:] = [c for c in queue if not set(c.changes) & set(cand.changes)]
                queue[:0] = self._plan_work()[1]

    def _budget_left(self) -> bool:
        if self.trials >= self.s.max_trials:
            return False
        return self._can_afford(1)

    # ------------------------------------------------------------------ pieces
    def _diagnose(self, outcome: RunOutcome) -> list[Finding]:
        with self._store() as store:
            run = store.run(outcome.run_id)
            findings = diagnose(store.metrics(outcome.run_id), store.events(outcome.run_id),
                                config=run["config"])
        return [f for f in findings if f.kind in space_kinds()]

    def _config_of(self, outcome: RunOutcome) -> dict[str, Any]:
        with self._store() as store:
            return space.flatten(store.run(outcome.run_id)["config"] or {})

    def _figures(self, runs: Sequence[RunOutcome]) -> dict[str, Any]:
        windows = [tstats.steady(r.rates) for r in runs]
        pooled = [x for w in windows for x in w]
        out: dict[str, Any] = {
            "runs": [r.run_id for r in runs], "wall_s": sum(r.wall_s for r in runs),
            "windows": [len(w) for w in windows],
            "warmup_dropped": [len(r.rates) - len(w) for r, w in zip(runs, windows,
                                                                      strict=True)]}
        if pooled:
            out["samples_per_s"] = tstats.mean_interval(pooled, self.s.confidence).as_dict()
        return out

    def _ratio(self, cand: Sequence[RunOutcome], base: Sequence[RunOutcome]) -> tstats.Interval:
        return tstats.ratio_interval([tstats.steady(r.rates) for r in cand],
                                     [tstats.steady(r.rates) for r in base],
                                     self.s.confidence)

    def _control(self, control: Candidate) -> None:
        self.trials += 1
        changes = {**self.incumbent, **control.changes}
        out = self._run(f"control-{control.control}", changes, control=control.control)
        if not out.ok:
            self._record(control.label, "control", "failed", control.changes,
                         {"error": out.error}, f"control failed ({out.error}); its family is "
                         "tried without a bound")
            return
        ratio = self._ratio([out], self.reference[-1:])
        figures = {**self._figures([out]), "ratio": ratio.as_dict(), "reason": control.reason}
        if ratio.high < 1 + self.s.min_gain:
            self.futile.add(control.family)
            self._record(control.label, "control", "bound", control.changes, figures,
                         f"even removing all {control.family} cost gains only "
                         f"{ratio.text()}x (< {1 + self.s.min_gain:g}): {control.family} "
                         "changes skipped")
        else:
            self._record(control.label, "control", "bound", control.changes, figures,
                         f"removing all {control.family} cost gains up to {ratio.text()}x: "
                         f"{control.family} changes are worth trying")

    def _candidate(self, cand: Candidate) -> bool:
        """Try one candidate; True when it was adopted."""
        changes = {**self.incumbent, **cand.changes}
        key = tuple(sorted((k, repr(v)) for k, v in changes.items()))
        if changes == self.incumbent or key in self.tried:
            return False
        self.tried.add(key)
        if cand.family in self.futile:
            self._record(cand.label, "candidate", "skipped", cand.changes,
                         {"reason": cand.reason},
                         f"the {cand.family} control bounds any gain below "
                         f"{1 + self.s.min_gain:g}x")
            return False
        problem = space.check(self.base_flat, changes)
        if problem:
            self._record(cand.label, "candidate", "invalid", cand.changes,
                         {"reason": cand.reason}, f"not a valid config here: {problem}")
            return False
        self.trials += 1
        first = self._run("stage1", changes)
        if not first.ok:
            self._record(cand.label, "candidate", "failed", cand.changes,
                         {"error": first.error, "reason": cand.reason,
                          "runs": [first.run_id], "wall_s": first.wall_s},
                         f"the trial failed: {first.error}")
            return False
        before = self.reference[-1]
        ratio1 = self._ratio([first], [before])
        iv_c = tstats.mean_interval(tstats.steady(first.rates), self.s.confidence)
        iv_b = tstats.mean_interval(tstats.steady(before.rates), self.s.confidence)
        figures = {**self._figures([first]), "ratio": ratio1.as_dict(), "stage": 1,
                   "reason": cand.reason, "lossy": cand.lossy}
        if tstats.cannot_win(iv_c, iv_b) or ratio1.high < 1 + self.s.min_gain:
            self._record(cand.label, "candidate", "stopped-early", cand.changes, figures,
                         f"stage 1: {ratio1.text()}x the current plan; cannot reach "
                         f"{1 + self.s.min_gain:g}x")
            return False
        if not self._can_afford(2):
            self._record(cand.label, "candidate", "not-significant", cand.changes, figures,
                         f"stage 1: {ratio1.text()}x; no budget left to confirm it (A/B/A)")
            return False
        second = self._run("stage2", changes)
        after = self._run("reference", self.incumbent)
        if not second.ok or not after.ok:
            bad = second if not second.ok else after
            self._record(cand.label, "candidate", "failed", cand.changes,
                         {**figures, "error": bad.error},
                         f"stage 2 failed ({bad.name}: {bad.error})")
            if after.ok:
                self.reference.append(after)
            return False
        self.reference.append(after)
        if not self.incumbent:
            self.original.append(after)
        ratio = self._ratio([first, second], [before, after])
        figures = {**self._figures([first, second]), "ratio": ratio.as_dict(), "stage": 2,
                   "reason": cand.reason, "lossy": cand.lossy,
                   "baseline_runs": [before.run_id, after.run_id]}
        if not tstats.is_win(ratio, self.s.min_gain):
            self._record(cand.label, "candidate", "not-significant", cand.changes, figures,
                         f"A/B/A: {ratio.text()}x; the lower bound does not exceed "
                         f"{1 + self.s.min_gain:g}")
            return False
        if cand.lossy:
            verdict = self._guard(changes, second, after)
            figures["guard"] = verdict.as_dict()
            if not verdict.ok:
                self._record(cand.label, "candidate", "rejected", cand.changes, figures,
                             f"faster ({ratio.text()}x) but fails the convergence "
                             f"guardrail: {verdict.reason}")
                return False
        self._record(cand.label, "candidate", "adopted", cand.changes, figures,
                     f"A/B/A: {ratio.text()}x the plan before, lower bound > "
                     f"{1 + self.s.min_gain:g}" + (" ; guardrail passed" if cand.lossy else ""))
        for key in cand.changes:
            self.evidence[key] = (f"{cand.reason}; trial {self.records[-1].trial_id}: "
                                  f"{ratio.text()}x (A/B/A, {self.s.confidence:.0%} CI)")
        self.incumbent = changes
        self.reference = [first, second]
        self.findings = self._diagnose(second)
        self.base_flat = {**self._config_of(second)}
        return True

    def _guard(self, changes: Mapping[str, Any], cand_run: RunOutcome,
               base_run: RunOutcome) -> guard.GuardResult:
        steps = self.s.guard_steps or self.s.steps
        if steps != self.s.steps:  # dedicated runs over the guard's steps
            base_run = self._run("guard-base", self.incumbent, steps=steps)
            cand_run = self._run("guard-cand", changes, steps=steps)
        return guard.compare(base_run.losses, cand_run.losses)

    def _speedup(self) -> tstats.Interval | None:
        if not self.incumbent:
            return None
        return self._ratio(self.reference, self.original)

    def _result(self) -> TuneResult:
        baseline = self._figures(self.original).get("samples_per_s")
        return TuneResult(
            session_id=self.session, changes=dict(self.incumbent), records=self.records,
            trials=self.trials, wall_s=self._elapsed(), speedup=self._speedup(),
            findings=self.findings,
            baseline=tstats.Interval(**baseline) if baseline else None,
            evidence=self.evidence)

    def _summary(self) -> dict[str, Any]:
        speed = self._speedup()
        return {"chosen": dict(self.incumbent), "trials": self.trials,
                "runs": self.runner.runs, "wall_s": self._elapsed(),
                "speedup": speed.as_dict() if speed else None,
                "evidence": self.evidence}


def space_kinds() -> frozenset[str]:
    """The finding kinds the tuner acts on (the performance ones)."""
    from tandem.analyze.diagnose import PERFORMANCE_KINDS

    return PERFORMANCE_KINDS | {"balanced"}
