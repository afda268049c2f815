"""Statistics of trial measurements: warm-up, one figure per run, run-level intervals.

The unit of every interval is the RUN. Logging windows inside one run are correlated
(the same processes, the same cache state, the same neighbours on the machine), so an
interval over windows is far narrower than the spread between two runs of the same plan
minutes apart (docs/benchmarks.md, "The tuner"). The rules, all tested against
independent computations in tests/unit/test_tune_stats.py:

* **Warm-up.** The first window always goes (process start, loader workers, allocator
  growth). Then MSER (White 1997, the Marginal Standard Error Rule) picks how many more
  leading windows to drop: the truncation d in [1, n/2] that minimises
  sum((x_i - mean(x[d:]))^2) / (n - d)^2 over the window rates.
* **One figure per run** (`run_rates`), over the windows after warm-up:
  ``wall`` = samples / wall-clock time between the close of the last warm-up window and
  the close of the last window (what a user sees: logging, evaluation and checkpoint
  pauses included); ``step`` = samples / the training time of those windows (the step
  alone: what a diagnosis' prediction is about).
* **Paired runs.** An arm (a candidate plan, a control, or the placebo) is measured in
  pairs against the reference plan, each pair one run of each, their order alternating
  (AB, BA, AB, ...: linear drift of the machine cancels across pairs; no run is shared
  between pairs, so pairs are independent). One observation per pair:
  r = log(arm figure / reference figure).
* **The machine's noise** (`pooled_sd`): the standard deviation of r around each arm's
  own mean, pooled over every arm of the session, with sum(n_arm - 1) degrees of
  freedom; the placebo's pairs count around zero, their true mean (the same plan on
  both sides), so each of them is one degree of freedom (an order effect between the
  first and the second run of a pair only inflates that estimate). Pooling assumes the
  run-to-run noise is the same multiplicative noise whatever the plan; it is what lets
  an arm of one or two pairs get an honest interval.
* **An arm's ratio** (`arm_interval`): exp(mean r) with the Student-t interval
  exp(mean r +- t(df) * sd / sqrt(n)).
* **The placebo.** Every session measures an A/A arm: the reference plan against
  itself. Its interval is what a change that does nothing shows on this machine today.
* **Noise floor and decisions** (`noise_floor`, `judge`, `look_confidence`): an arm
  wins when the lower bound of its own interval exceeds the floor = max(1 + min_gain,
  the placebo's bias). The arm's interval already carries the machine's noise (the
  pooled sd, the placebo's pairs included), so the floor does not add the placebo's
  spread a second time: the placebo's *bias* (its estimate, or its inverse: which run of
  an A/A pair is "A" is arbitrary) raises the floor only when the placebo's interval
  excludes 1, i.e. when two runs of one plan differ systematically on this machine
  today in a way the alternating order did not cancel. An arm is judged after each of
  its pairs, at most max_pairs times (a sequential test): its interval is taken at the
  look's confidence (`look_confidence`: half the arm's error rate spent on its first
  look, the other half split evenly over the later ones: a union bound over the looks).
  A session tries several arms: each spends a share of the error rate (`Arm.share`; the
  tuner gives its k-th candidate 2^-k, largest predicted gain first, a weighted
  Bonferroni bound), so the chance that a session adopts any plan no faster than its
  reference is at most (1 - confidence) / 2 in all (2.5% at 95%; tested by
  simulation), while the candidate the diagnosis expects most from keeps most of the
  power. An arm wins as soon as that lower bound exceeds the floor, from its first pair
  on: an effect that dwarfs the noise is decided in one or two pairs, a small one gets
  more. It is stopped when its (nominal) upper bound is below the floor (it cannot beat
  it); otherwise it gets another pair, up to max_pairs, after which it is not
  significant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95
MIN_GAIN = 0.05
MIN_PAIRS = 1  # pairs before an arm may win (the sequential rule guards one pair)
MAX_PAIRS = 4  # pairs before an undecided arm is not significant


@dataclass(frozen=True)
class Interval:
    """An estimate with a two-sided confidence interval from `n` observations."""

    estimate: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        """JSON-ready form."""
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "n": self.n}

    def text(self, digits: int = 3) -> str:
        """'12.3 [11.9, 12.8]'."""
        return (f"{self.estimate:.{digits}g} [{self.low:.{digits}g}, "
                f"{self.high:.{digits}g}]")


def warmup_windows(values: Sequence[float]) -> int:
    """How many leading windows are warm-up (the first one always; MSER for the rest)."""
    n = len(values)
    if n <= 2:
        return 1 if n == 2 else 0
    best_d, best = 1, math.inf
    for d in range(1, n // 2 + 1):
        tail = values[d:]
        m = math.fsum(tail) / len(tail)
        score = math.fsum((x - m) ** 2 for x in tail) / len(tail) ** 2
        if score < best:
            best_d, best = d, score
    return best_d


def steady(values: Sequence[float]) -> list[float]:
    """The windows after warm-up (finite values only)."""
    good = [float(v) for v in values if v is not None and math.isfinite(v)]
    return good[warmup_windows(good):]


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer `df` (exact finite series, A&S 26.7.3-4)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):
            if k > 1:
                term *= c2 * (2 * k - 2) / (2 * k - 1)
            total += term
        inside = 2 / math.pi * (theta + s * total) if df > 1 else 2 / math.pi * theta
    else:
        total, term = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    return 0.5 + math.copysign(0.5 * inside, t)


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with integer `df` degrees of freedom.

    Starts from the Cornish-Fisher expansion (A&S 26.7.5) and refines it by bisection on
    the exact distribution function (`t_cdf`) to about 1e-12.
    """
    if df < 1:
        raise ValueError(f"t_quantile: df must be >= 1, got {df}")
    if not 0 < p < 1:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    z = NormalDist().inv_cdf(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    guess = z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4
    lo, hi = guess - 1.0, guess + 1.0
    while t_cdf(lo, df) > p:
        lo -= 2 * (hi - lo)
    while t_cdf(hi, df) < p:
        hi += 2 * (hi - lo)
    for _ in range(100):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean with its Student-t confidence interval (a point for a single value)."""
    if not values:
        raise ValueError("mean_interval needs at least one value")
    n = len(values)
    m = math.fsum(values) / n
    if n == 1:
        return Interval(m, m, m, 1)
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return Interval(m, m - half, m + half, n)


def rate_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """A rate's geometric mean with the t-interval of its logs: never below zero (two runs
    of a plan at 2,600 and 3,800 samples/s give a wide interval, not a negative bound),
    and on the same log scale as the ratios. The plain t-interval where a rate is not
    positive."""
    if not values or min(values) <= 0:
        return mean_interval(values, confidence)
    logs = mean_interval([math.log(v) for v in values], confidence)
    return Interval(math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high), logs.n)


@dataclass(frozen=True)
class WindowFigure:
    """One logging window of a run: its samples, training seconds and closing time."""

    step: int
    samples: float
    busy_s: float
    time: float  # wall clock (s) when the window closed


def _measured(windows: Sequence[WindowFigure]) -> list[WindowFigure]:
    return [w for w in windows if w.busy_s > 0 and w.samples > 0 and math.isfinite(w.time)]


def _rates(kept: Sequence[WindowFigure], start_time: float) -> dict[str, float]:
    samples = math.fsum(w.samples for w in kept)
    out = {"step": samples / math.fsum(w.busy_s for w in kept)}
    span = kept[-1].time - start_time
    if span > 0:
        out["wall"] = samples / span
    return out


def warmup_end(windows: Sequence[WindowFigure]) -> int | None:
    """The step at which the run's warm-up ends (None: no steady window after it)."""
    good = _measured(windows)
    drop = warmup_windows([w.samples / w.busy_s for w in good])
    return good[drop - 1].step if 1 <= drop < len(good) else None


def run_rates(windows: Sequence[WindowFigure]) -> dict[str, float]:
    """The run's steady throughput: {'wall': samples/s, 'step': samples/s} ({} if none)."""
    good = _measured(windows)
    drop = warmup_windows([w.samples / w.busy_s for w in good])
    if drop < 1 or drop >= len(good):
        return {}
    return _rates(good[drop:], good[drop - 1].time)


def rates_between(windows: Sequence[WindowFigure], first: int,
                  last: int) -> dict[str, float]:
    """Throughput over steps `first` (exclusive) to `last` ({} if none): what two runs of
    different lengths are compared on, the same steps, so that a step-dependent schedule
    (a sequence or batch ramp, evaluations from some step on) weighs the same in both. A
    window that straddles a bound counts in proportion to its steps inside (its steps
    taken as alike); the first window, with no start time, never counts."""
    samples = busy = span = 0.0
    good = _measured(windows)
    for before, w in zip(good, good[1:], strict=False):
        inside = min(w.step, last) - max(before.step, first)
        if inside > 0:
            share = inside / (w.step - before.step)
            samples += share * w.samples
            busy += share * w.busy_s
            span += share * (w.time - before.time)
    if samples <= 0 or busy <= 0:
        return {}
    out = {"step": samples / busy}
    if span > 0:
        out["wall"] = samples / span
    return out


def pooled_sd(groups: Iterable[Sequence[float]],
              zero_mean: Iterable[Sequence[float]] = ()) -> tuple[float, int]:
    """(standard deviation around each group's own mean, pooled; degrees of freedom).

    The values of each `zero_mean` group count around zero, their known mean (one degree
    of freedom each). NaN and 0 when nothing gives a degree of freedom."""
    ss, df = 0.0, 0
    for values in groups:
        xs = [float(x) for x in values if math.isfinite(x)]
        if len(xs) >= 2:
            m = math.fsum(xs) / len(xs)
            ss += math.fsum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
    for values in zero_mean:
        xs = [float(x) for x in values if math.isfinite(x)]
        ss += math.fsum(x * x for x in xs)
        df += len(xs)
    return (math.sqrt(ss / df), df) if df else (math.nan, 0)


def arm_interval(logs: Sequence[float], sd: float, df: int,
                 confidence: float = CONFIDENCE) -> Interval:
    """exp(mean of the log ratios) with its t-interval from the pooled `sd` and `df`.

    Without a noise estimate (df 0) the interval is [0, inf]: nothing can be decided.
    """
    if not logs:
        raise ValueError("arm_interval needs at least one pair")
    n = len(logs)
    m = math.fsum(logs) / n
    if df < 1 or not math.isfinite(sd):
        return Interval(math.exp(m), 0.0, math.inf, n)
    half = t_quantile(0.5 + confidence / 2, df) * sd / math.sqrt(n)
    return Interval(math.exp(m), math.exp(m - half), math.exp(m + half), n)


def noise_floor(placebo: Interval | None, min_gain: float = MIN_GAIN) -> float:
    """What a gain's lower bound must exceed: 1 + min_gain, raised to the placebo's bias
    (its estimate, or the estimate's inverse: an A/A ratio has no direction) when its
    interval excludes 1; infinite without a placebo or a noise estimate: no winner
    without a measured noise."""
    if placebo is None or placebo.low <= 0 or not math.isfinite(placebo.high):
        return math.inf
    bias = 1.0
    if placebo.low > 1 or placebo.high < 1:
        bias = max(placebo.estimate, 1 / placebo.estimate)
    return max(1 + min_gain, bias)


def share_confidence(confidence: float, share: float) -> float:
    """The confidence of an arm that may spend `share` of the session's error rate."""
    return 1 - (1 - confidence) * share


def look_confidence(confidence: float, max_pairs: int, look: int = 1) -> float:
    """The confidence of look `look` (1-based) of the sequential test: half the error
    rate goes to the first look, the other half is split evenly over the later ones (all
    of it to the first when there is only one), so that it holds over all max_pairs looks
    (a union bound) while an effect that dwarfs the noise can be decided at its first."""
    alpha, looks = 1 - confidence, max(1, max_pairs)
    if looks == 1:
        return confidence
    return 1 - (alpha / 2 if look <= 1 else alpha / 2 / (looks - 1))


def judge(ratio: Interval, floor: float, min_pairs: int = MIN_PAIRS,
          max_pairs: int = MAX_PAIRS, nominal: Interval | None = None) -> str:
    """'win', 'lose' (cannot beat the floor), 'more' (another pair) or 'undecided'.

    `ratio` is the interval at the look's confidence (`look_confidence`); `nominal`, at
    the session's own (default: `ratio`), is what 'lose' reads."""
    if ratio.n >= min_pairs and ratio.low > floor:
        return "win"
    if (nominal or ratio).high < floor:
        return "lose"
    return "more" if ratio.n < max_pairs else "undecided"


def combine(parts: Sequence[Interval], sd: float, df: int,
            confidence: float = CONFIDENCE) -> Interval:
    """The product of independent arm ratios (plans adopted one after another), with the
    t-interval of the sum of their mean log ratios."""
    if not parts:
        raise ValueError("combine needs at least one ratio")
    m = math.fsum(math.log(p.estimate) for p in parts)
    n = sum(p.n for p in parts)
    if df < 1 or not math.isfinite(sd):
        return Interval(math.exp(m), 0.0, math.inf, n)
    half = t_quantile(0.5 + confidence / 2, df) * sd * math.sqrt(sum(1 / p.n for p in parts))
    return Interval(math.exp(m), math.exp(m - half), math.exp(m + half), n)
