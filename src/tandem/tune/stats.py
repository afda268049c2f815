"""Statistics of trial measurements: warm-up, steady-state throughput, intervals, decisions.

A trial run records one throughput figure per logging window (samples/s over the
window's training time). The rules, all documented here and tested against independent
computations in tests/unit/test_tune_stats.py:

* **Warm-up.** The first window always goes (process start, loader workers, allocator
  growth). Then MSER (White 1997, the Marginal Standard Error Rule) picks how many more
  leading windows to drop: the truncation d in [1, n/2] that minimises
  sum((x_i - mean(x[d:]))^2) / (n - d)^2, i.e. the squared standard error of the
  steady-state mean. A transient at the start inflates the spread of what remains;
  MSER removes it only while that pays for the lost windows.
* **Steady-state throughput.** The mean of the kept window rates with a Student-t
  interval (t quantile inverted from the exact distribution function).
* **Ratio of two plans.** Candidate mean / baseline mean with a percentile bootstrap
  interval (resampling windows within each run, so every run keeps its weight; a fixed
  seed makes the decision reproducible). Run-to-run drift of the machine is handled by
  the design, not the formula: the baseline is measured again after each candidate that
  gets a second stage (A/B/A), and the candidate is compared with the baseline runs that
  bracket it.
* **Early stop.** After its first stage a candidate stops when the upper bound of its
  throughput interval is below the lower bound of the baseline's: it cannot win.
* **Win.** A candidate is adopted only when the lower bound of the ratio interval
  exceeds 1 + MIN_GAIN (5%): the gain is outside the noise and worth a change.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

CONFIDENCE = 0.95
MIN_GAIN = 0.05
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240601


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


def ratio_interval(candidate: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]],
                   confidence: float = CONFIDENCE, samples: int = BOOTSTRAP_SAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> Interval:
    """mean(candidate) / mean(baseline), with a percentile bootstrap interval.

    Each argument is a list of runs, each run its steady window rates; windows are
    resampled within their run (stratified bootstrap).
    """
    cand = [list(r) for r in candidate if r]
    base = [list(r) for r in baseline if r]
    if not cand or not base:
        raise ValueError("ratio_interval needs windows on both sides")
    rng = random.Random(seed)

    def resampled_mean(runs: list[list[float]]) -> float:
        total, count = 0.0, 0
        for run in runs:
            total += math.fsum(rng.choice(run) for _ in run)
            count += len(run)
        return total / count

    def pooled(runs: list[list[float]]) -> float:
        return math.fsum(x for r in runs for x in r) / sum(len(r) for r in runs)

    point = pooled(cand) / pooled(base)
    draws = sorted(resampled_mean(cand) / resampled_mean(base) for _ in range(samples))
    alpha = (1 - confidence) / 2
    low = draws[max(0, math.floor(alpha * samples))]
    high = draws[min(samples - 1, math.ceil((1 - alpha) * samples) - 1)]
    n = sum(len(r) for r in cand) + sum(len(r) for r in base)
    return Interval(point, low, high, n)


def cannot_win(candidate: Interval, baseline: Interval) -> bool:
    """Early stop: even the candidate's upper bound is below the baseline's lower bound."""
    return candidate.high < baseline.low


def is_win(ratio: Interval, min_gain: float = MIN_GAIN) -> bool:
    """Adopt: the whole ratio interval lies above 1 + min_gain."""
    return ratio.low > 1 + min_gain
