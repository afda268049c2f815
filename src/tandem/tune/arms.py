"""Arms measured in paired runs against a reference plan, and the session's own noise.

An `Arm` is a plan (or a control) compared with a reference plan. Each `pair` launches
one run of each, the order alternating from one pair of the arm to the next (AB, BA,
AB, ...), and keeps log(arm figure / reference figure) for each figure of a run
('wall' and 'step' throughput, over the steps both of the pair's runs trained past both
warm-ups: `stats.rates_between`). A `Bench` holds every arm of a session, the
placebo (the reference plan against itself) among them, pools their pairs into the
machine's noise, and gives each arm its run-level interval and verdict (`stats.py`).

The Bench launches runs through a callable (tag, changes, control) -> RunOutcome, so
the same statistics serve the tuner, the control experiments, `--hparams` and the
benchmarks, and can be exercised without processes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.tune import stats
from tandem.tune.trial import RunOutcome

Launch = Callable[[str, Mapping[str, Any], str], RunOutcome]
FigureOf = Callable[[RunOutcome], Mapping[str, float]]
FIGURES = ("wall", "step")
TASKS = "tasks"  # a mixture's figure: 1 / seconds to every task's target (`mixing.py`)
PLACEBO = "placebo"


@dataclass
class Pair:
    """One run of the reference plan and one of the arm, in the order they ran."""

    reference: RunOutcome
    arm: RunOutcome
    arm_first: bool
    figure_of: FigureOf = lambda run: run.figures

    def value(self, who: str, figure: str) -> float | None:
        """One figure of the pair's 'arm' or 'reference' run (None when it lacks it).

        Throughput ('wall', 'step') of runs with logging windows counts the steps both
        runs trained past both warm-ups: runs are sized by their plan's speed, so one may
        be longer, and the job's per-step schedule (a sequence or batch ramp, evaluations
        from some step on) must weigh the same in the two. Other figures, and runs
        without windows, are `figure_of`'s."""
        run = self.arm if who == "arm" else self.reference
        if figure not in FIGURES or not (self.arm.windows and self.reference.windows):
            return self.figure_of(run).get(figure)
        ends = [stats.warmup_end(r.windows) for r in (self.arm, self.reference)]
        if None in ends:
            return None
        last = min(r.windows[-1].step for r in (self.arm, self.reference))
        return stats.rates_between(run.windows, max(e for e in ends if e is not None),
                                   last).get(figure)

    def log_ratio(self, figure: str) -> float | None:
        """log(arm / reference) of one figure (None when either run lacks it)."""
        a, r = self.value("arm", figure), self.value("reference", figure)
        if not a or not r or not (math.isfinite(a) and math.isfinite(r)):
            return None
        return math.log(a / r)


@dataclass
class Arm:
    """A plan compared with a reference plan in paired runs."""

    label: str
    kind: str  # placebo, control, candidate, confirm
    changes: dict[str, Any]  # the arm's full changes over the job's own plan
    reference: dict[str, Any]  # the reference plan's changes over the job's own plan
    control: str = ""  # launcher control (the in-memory data shim)
    figure: str = "wall"  # the figure its decisions use
    share: float = 1.0  # the fraction of the session's error rate it may spend
    pairs: list[Pair] = field(default_factory=list)
    failure: RunOutcome | None = None  # the run (its or its reference's) that failed

    def logs(self, figure: str | None = None) -> list[float]:
        """The log ratios of its pairs for one figure (its own by default)."""
        values = [p.log_ratio(figure or self.figure) for p in self.pairs]
        return [v for v in values if v is not None]


class Bench:
    """Every arm of one session: runs their pairs, pools their noise, judges them."""

    def __init__(self, launch: Launch, min_gain: float = stats.MIN_GAIN,
                 confidence: float = stats.CONFIDENCE,
                 figure_of: FigureOf = lambda run: run.figures) -> None:
        self.launch = launch
        self.figure_of = figure_of
        self.min_gain = min_gain
        self.confidence = confidence
        self.arms: list[Arm] = []

    def add(self, arm: Arm) -> Arm:
        """Register an arm (its pairs then count towards the session's noise)."""
        self.arms.append(arm)
        return arm

    @property
    def placebo(self) -> Arm | None:
        """The A/A arm, once added."""
        return next((a for a in self.arms if a.kind == PLACEBO), None)

    def pair(self, arm: Arm, reference_run: RunOutcome | None = None) -> str:
        """Run one pair for `arm` ('' when both runs worked, else what failed).

        `reference_run`, a run of the reference plan just made, stands for the pair's
        reference run (it then comes first)."""
        arm_first = reference_run is None and len(arm.pairs) % 2 == 1
        runs: dict[str, RunOutcome] = {}
        if reference_run is not None:
            runs["ref"] = reference_run
        for who in ("arm", "ref") if arm_first else ("ref", "arm"):
            if who in runs:
                continue
            out = (self.launch(arm.kind, arm.changes, arm.control) if who == "arm"
                   else self.launch("ref", arm.reference, ""))
            runs[who] = out
            if not out.ok:
                arm.failure = out
                return (f"{out.name}: {out.error}" if who == "arm"
                        else f"reference run {out.name}: {out.error}")
        arm.pairs.append(Pair(runs["ref"], runs["arm"], arm_first, self.figure_of))
        return ""

    # ------------------------------------------------------------------ statistics
    def noise(self, figure: str) -> tuple[float, int]:
        """(pooled sd of the pair log ratios, degrees of freedom) over every arm; the
        placebo's around zero, its true mean."""
        return stats.pooled_sd((a.logs(figure) for a in self.arms if a.kind != PLACEBO),
                               (a.logs(figure) for a in self.arms if a.kind == PLACEBO))

    def interval(self, arm: Arm, figure: str | None = None,
                 confidence: float | None = None) -> stats.Interval | None:
        """The arm's ratio to its reference with the session's noise (None: no pair)."""
        logs = arm.logs(figure)
        if not logs:
            return None
        sd, df = self.noise(figure or arm.figure)
        return stats.arm_interval(logs, sd, df, confidence or self.confidence)

    def floor(self, figure: str) -> float:
        """What a gain's lower bound must exceed (`stats.noise_floor`)."""
        placebo = self.placebo
        iv = self.interval(placebo, figure) if placebo is not None else None
        return stats.noise_floor(iv, self.min_gain)

    def judge(self, arm: Arm, min_pairs: int = stats.MIN_PAIRS,
              max_pairs: int = stats.MAX_PAIRS) -> str:
        """'win', 'lose', 'more' or 'undecided' (`stats.judge`, the sequential rule: each
        look at the confidence `stats.look_confidence` gives); 'more' with no pair."""
        confidence = stats.share_confidence(self.confidence, arm.share)
        nominal = self.interval(arm, confidence=confidence)
        if nominal is None:
            return "more"
        look = self.interval(arm, confidence=stats.look_confidence(
            confidence, max_pairs, len(arm.logs())))
        assert look is not None
        return stats.judge(look, self.floor(arm.figure), min_pairs, max_pairs, nominal)

    def rejudge(self, adopted: list[Arm]) -> tuple[list[Arm], list[Arm]]:
        """The adoptions that still clear the floor with the session's final noise, and
        those that do not: (kept, revoked).

        An arm was adopted on the noise pooled when it was judged; the arms measured
        after it may show the machine noisier than that. Each adoption is judged again
        in order; at the first whose lower bound no longer clears the floor, it and every
        later one (measured on top of it) are revoked."""
        for i, arm in enumerate(adopted):
            iv = self.interval(arm, confidence=stats.share_confidence(self.confidence,
                                                                      arm.share))
            if iv is None or not iv.low > self.floor(arm.figure):
                return adopted[:i], adopted[i:]
        return list(adopted), []

    # ------------------------------------------------------------------ record
    def noise_record(self, figure: str) -> dict[str, Any]:
        """The session's noise as it stands: pooled sd, df, the placebo, the floor."""
        sd, df = self.noise(figure)
        placebo = self.placebo
        iv = self.interval(placebo, figure) if placebo is not None else None
        return {"figure": figure, "pair_sd": sd if math.isfinite(sd) else None, "df": df,
                "placebo": iv.as_dict() if iv else None,
                "placebo_pairs": len(placebo.pairs) if placebo else 0,
                "floor": self.floor(figure)}

    def record(self, arm: Arm) -> dict[str, Any]:
        """The arm's evidence, JSON-ready: runs, medians, run-level intervals, noise."""
        fig = arm.figure
        arm_rates = [v for p in arm.pairs if (v := p.value("arm", fig)) is not None]
        ref_rates = [v for p in arm.pairs if (v := p.value("reference", fig)) is not None]
        out: dict[str, Any] = {
            "figure": fig, "pairs": len(arm.pairs),
            "runs": [p.arm.run_id for p in arm.pairs],
            "baseline_runs": [p.reference.run_id for p in arm.pairs],
            "order": ["BA" if p.arm_first else "AB" for p in arm.pairs],
            "wall_s": sum(p.arm.wall_s + p.reference.wall_s for p in arm.pairs),
            "noise": self.noise_record(fig)}
        if arm_rates and ref_rates:
            out["samples_per_s"] = stats.rate_interval(arm_rates, self.confidence).as_dict()
            out["medians"] = {"arm": statistics.median(arm_rates),
                              "reference": statistics.median(ref_rates)}
        iv = self.interval(arm)
        if iv is not None:
            out["ratio"] = iv.as_dict()
        return out

    def placebo_rate(self) -> stats.Interval | None:
        """The current plan's samples/s over the placebo's runs (None: none yet)."""
        placebo = self.placebo
        runs = [r.figures["wall"] for p in (placebo.pairs if placebo else ())
                for r in (p.reference, p.arm) if "wall" in r.figures]
        return stats.rate_interval(runs, self.confidence) if runs else None

    def startups(self) -> dict[str, float | int] | None:
        """What the runs' start-ups cost the session (each run's own `startup_s`, from
        its process's start to its first step): runs, total and median seconds."""
        runs = {id(r): r for a in self.arms for p in a.pairs for r in (p.arm, p.reference)}
        figures = [float(r.summary["startup_s"]) for r in runs.values()
                   if isinstance(r.summary.get("startup_s"), (int, float))]
        if not figures:
            return None
        return {"runs": len(figures), "total_s": sum(figures),
                "median_s": statistics.median(figures)}


def evidence_text(record: Mapping[str, Any]) -> str:
    """One line of evidence: '1.52x [1.31, 1.77], 3 pairs, medians 812 vs 534 samples/s,
    placebo 1.01x [0.93, 1.10]'."""
    ratio = record.get("ratio")
    if not ratio:
        return "no pair measured"
    figure = record.get("figure", "wall")
    what = ("1 / seconds to every task's target" if figure == TASKS
            else f"{figure} samples/s")
    parts = [f"{_iv(ratio)}x ({what}, {record.get('pairs', 0)} paired runs)"]
    medians = record.get("medians")
    if medians and figure == TASKS:
        parts.append(f"medians {1 / medians['arm']:.4g} vs {1 / medians['reference']:.4g} s "
                     "to every target")
    elif medians:
        parts.append(f"medians {medians['arm']:.4g} vs {medians['reference']:.4g} samples/s")
    noise = record.get("noise") or {}
    spread = f"pair sd {100 * (noise.get('pair_sd') or 0):.1f}%, {noise.get('df', 0)} df"
    if noise.get("placebo") and noise["placebo"] != ratio:
        parts.append(f"placebo {_iv(noise['placebo'])}x over {noise['placebo_pairs']} pairs "
                     f"({spread})")
    elif noise:
        parts.append(spread)
    return ", ".join(parts)


def _iv(d: Mapping[str, Any]) -> str:
    return f"{d['estimate']:.3g} [{d['low']:.3g}, {d['high']:.3g}]"
