"""The statistics of the speedrun's record rule: Welch's one-sided t-test over seeds.

A new record must be faster than the previous one with p < 0.01: the null hypothesis is
that the new recipe's mean time-to-target is not below the old one's; Welch's t (unequal
variances) with the Welch-Satterthwaite degrees of freedom. scipy computes the tail when
it is installed; otherwise the Student t tail comes from the regularised incomplete beta
function below (Numerical Recipes' continued fraction), tested against scipy and against
printed table values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

RECORD_P = 0.01  # the p-value a new record must stay under


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x: {x!r} is out of range; expected a number in [0, 1]")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` (real, > 0) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df: {df!r} is out of range; expected a number > 0")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    half = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return half if t >= 0 else 1.0 - half


@dataclass(frozen=True)
class Welch:
    """The outcome of a one-sided Welch test that `new` has a smaller mean than `old`."""

    t: float
    df: float
    p: float
    source: str  # "scipy" or "own": who computed the t tail


def welch_less(new: Sequence[float], old: Sequence[float], use_scipy: bool = True) -> Welch:
    """One-sided Welch t-test of H1: mean(new) < mean(old). Needs >= 2 values in each."""
    if len(new) < 2 or len(old) < 2:
        raise ValueError(f"Welch's test needs >= 2 values per side; got {len(new)} and "
                         f"{len(old)}")
    var_new, var_old = statistics.variance(new) / len(new), statistics.variance(old) / len(old)
    spread = var_new + var_old
    diff = statistics.fmean(old) - statistics.fmean(new)
    if spread == 0:
        inf = math.inf if diff > 0 else -math.inf if diff < 0 else 0.0
        return Welch(inf, math.inf, 0.0 if diff > 0 else 1.0 if diff < 0 else 0.5, "exact")
    t = diff / math.sqrt(spread)
    df = spread**2 / (var_new**2 / (len(new) - 1) + var_old**2 / (len(old) - 1))
    if use_scipy:
        try:
            from scipy import stats
        except ImportError:
            pass
        else:
            return Welch(t, df, float(stats.t.sf(t, df)), "scipy")
    return Welch(t, df, t_upper_tail(t, df), "own")
