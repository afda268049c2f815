"""Downsampling keeps every bucket's extremes (spikes survive) and only real points."""

from __future__ import annotations

import math
import random

import pytest

from tandem.dashboard.downsample import column_max, minmax_indices


def test_short_series_are_kept_whole() -> None:
    assert minmax_indices([3.0, 1.0, 2.0], 100) == [0, 1, 2]


def test_spikes_and_nan_survive_and_points_are_bounded() -> None:
    rng = random.Random(0)
    values = [1.0 + rng.gauss(0, 0.01) for _ in range(50_000)]
    values[12_345] = 40.0  # a loss spike
    values[31_000] = -5.0
    values[40_001] = math.nan
    keep = minmax_indices(values, 1000)
    assert keep == sorted(set(keep))
    assert len(keep) <= 1000 + 1000 // 4  # at most one NaN extra per bucket
    kept = [values[i] for i in keep]
    assert max(v for v in kept if math.isfinite(v)) == 40.0
    assert min(v for v in kept if math.isfinite(v)) == -5.0
    assert any(math.isnan(v) for v in kept)
    # Each bucket's own min and max are kept: the envelope is the true one.
    buckets = 1000 // 4
    for b in range(0, buckets, 37):
        lo, hi = b * len(values) // buckets, (b + 1) * len(values) // buckets
        finite = [v for v in values[lo:hi] if math.isfinite(v)]
        mine = [values[i] for i in keep if lo <= i < hi and math.isfinite(values[i])]
        assert max(mine) == max(finite) and min(mine) == min(finite)
        assert lo in keep and hi - 1 in keep


def test_heatmap_columns_keep_the_slowest_window() -> None:
    steps = list(range(10, 10_010, 10))
    rows = [[1.0] * len(steps), [1.0] * len(steps)]
    rows[1][517] = 3.5
    out_steps, out = column_max(steps, rows, 100)
    assert len(out_steps) == 100 and all(len(r) == 100 for r in out)
    assert max(out[1]) == 3.5 and max(out[0]) == 1.0
    assert out[1][out_steps.index(next(s for s in out_steps if s >= steps[517]))] == 3.5


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="points"):
        minmax_indices([1.0] * 10, 3)
    with pytest.raises(ValueError, match="columns"):
        column_max([1], [[1.0]], 0)
