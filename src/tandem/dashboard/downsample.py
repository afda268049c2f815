"""Server-side downsampling that keeps spikes: bucketed first/min/max/last.

A long run has far more logging windows than a chart has pixels. Averaging would hide
the one window where the loss jumped; these functions keep, for each bucket of
consecutive points, its first and last point, its minimum and its maximum (and its
first non-finite value, since a NaN is the most important point of all), so the drawn
envelope is the true one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Points per series sent to a page: a few per horizontal pixel of a wide chart.
DEFAULT_POINTS = 2000
# Columns of a rank x window heatmap.
DEFAULT_COLUMNS = 400


def minmax_indices(values: Sequence[float], points: int = DEFAULT_POINTS) -> list[int]:
    """Indices (ascending) of at most `points` values that keep each bucket's extremes.

    All indices when there are no more than `points` values. Otherwise the values are cut
    into points // 4 buckets of consecutive indices; each keeps its first, last, min and
    max finite value and its first non-finite one.
    """
    n = len(values)
    if points < 4:
        raise ValueError(f"points must be >= 4 (first, min, max, last per bucket); got {points}")
    if n <= points:
        return list(range(n))
    buckets = points // 4
    keep: list[int] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        chosen = {lo, hi - 1}
        low = high = odd = None
        for i in range(lo, hi):
            v = values[i]
            if not math.isfinite(v):
                if odd is None:
                    odd = i
                continue
            if low is None or v < values[low]:
                low = i
            if high is None or v > values[high]:
                high = i
        chosen.update(i for i in (low, high, odd) if i is not None)
        keep += sorted(chosen)
    # One point too many per bucket can happen (first, last, min, max and a NaN).
    return keep


def take(seq: Sequence, indices: Sequence[int]) -> list:
    """`seq` at `indices`."""
    return [seq[i] for i in indices]


def _nanmax(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values):
        return math.nan  # a non-finite value in the bucket is what must show
    return max(finite) if finite else math.nan


def column_max(steps: Sequence[int], rows: Sequence[Sequence[float]],
               columns: int = DEFAULT_COLUMNS) -> tuple[list[int], list[list[float]]]:
    """Merge the columns of a rank x window matrix into at most `columns` buckets.

    Each bucket is labelled by its last step and holds each rank's largest value in it
    (NaN if any is NaN): a slow window must still show as slow.
    """
    n = len(steps)
    if columns < 1:
        raise ValueError(f"columns must be >= 1; got {columns}")
    if n <= columns:
        return list(steps), [list(r) for r in rows]
    bounds = [(b * n // columns, (b + 1) * n // columns) for b in range(columns)]
    out_steps = [steps[hi - 1] for _, hi in bounds]
    out_rows = [[_nanmax(r[lo:hi]) for lo, hi in bounds] for r in rows]
    return out_steps, out_rows
