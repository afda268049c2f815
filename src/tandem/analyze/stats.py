"""Small robust statistics for run figures: median, percentile, MAD, robust z-score."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# Scales the MAD so that it estimates the standard deviation of normal data:
# z = 0.6745 * (x - median) / MAD (Iglewicz and Hoaglin).
MAD_TO_Z = 0.6745


def finite(values: Iterable[float]) -> list[float]:
    """The finite values, in order (NaN and infinities dropped)."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def _nonempty(values: Sequence[float], what: str) -> list[float]:
    if not values:
        raise ValueError(f"{what} needs at least one value; got an empty sequence")
    return sorted(float(v) for v in values)


def median(values: Sequence[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    ordered = _nonempty(values, "median")
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean."""
    ordered = _nonempty(values, "mean")
    return math.fsum(ordered) / len(ordered)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    centre = median(values)
    return median([abs(v - centre) for v in values])


def robust_z(values: Sequence[float]) -> list[float]:
    """Robust z-score of each value: 0.6745 * (x - median) / MAD.

    With MAD = 0 (over half the values equal) a value equal to the median scores 0 and
    any other value scores +-inf: it differs from the bulk, which is the point.
    """
    centre = median(values)
    spread = mad(values)
    if spread == 0.0:
        return [0.0 if v == centre else math.copysign(math.inf, v - centre) for v in values]
    return [MAD_TO_Z * (v - centre) / spread for v in values]
