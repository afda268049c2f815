"""The tuner's statistics against independent computations on synthetic data."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tandem.tune import stats


@pytest.mark.parametrize("df", [1, 2, 3, 5, 10, 30, 100])
@pytest.mark.parametrize("p", [0.9, 0.95, 0.975, 0.995])
def test_t_quantile_matches_scipy(df: int, p: float) -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    exact = float(scipy_stats.t.ppf(p, df))
    assert stats.t_quantile(p, df) == pytest.approx(exact, rel=1e-9)
    assert stats.t_cdf(exact, df) == pytest.approx(p, abs=1e-12)
    assert stats.t_quantile(1 - p, df) == pytest.approx(-exact, rel=1e-9)


def test_t_interval_covers_the_true_mean_at_its_level() -> None:
    rng = random.Random(1)
    mu, sigma, reps, n = 100.0, 7.0, 2000, 8
    hits = 0
    for _ in range(reps):
        iv = stats.mean_interval([rng.gauss(mu, sigma) for _ in range(n)], 0.95)
        hits += iv.low <= mu <= iv.high
    # Binomial(2000, 0.95): sd 0.5%; 0.93..0.97 is four sd either side.
    assert 0.93 <= hits / reps <= 0.97


def test_mean_interval_is_the_textbook_t_interval() -> None:
    values = [3.1, 2.9, 3.4, 3.0, 3.3, 2.8]
    iv = stats.mean_interval(values, 0.95)
    half = 2.570582 * statistics.stdev(values) / math.sqrt(len(values))  # t(0.975, 5)
    assert iv.estimate == pytest.approx(statistics.fmean(values))
    assert iv.high - iv.estimate == pytest.approx(half, rel=1e-6)
    assert stats.mean_interval([5.0]) == stats.Interval(5.0, 5.0, 5.0, 1)


def test_ratio_interval_covers_the_true_ratio() -> None:
    rng = random.Random(2)
    reps, hits = 150, 0
    for _ in range(reps):
        cand = [[rng.gauss(130, 10) for _ in range(10)] for _ in range(2)]
        base = [[rng.gauss(100, 8) for _ in range(10)] for _ in range(2)]
        iv = stats.ratio_interval(cand, base, samples=400, seed=rng.randrange(1 << 30))
        hits += iv.low <= 1.3 <= iv.high
    assert hits / reps >= 0.88  # nominal 95%; percentile bootstrap runs a little narrow


def test_ratio_point_estimate_is_the_ratio_of_pooled_means() -> None:
    iv = stats.ratio_interval([[2.0, 4.0], [6.0]], [[1.0, 2.0, 3.0]])
    assert iv.estimate == pytest.approx(4.0 / 2.0)
    assert iv.low <= iv.estimate <= iv.high


def test_warmup_detection_finds_a_decaying_transient() -> None:
    rng = random.Random(3)
    found = []
    for _ in range(50):
        # Five slow windows decaying to a steady 1000 samples/s, 2% noise.
        series = [1000 * (1 - 0.6 * math.exp(-i / 1.2)) + rng.gauss(0, 20) for i in range(20)]
        found.append(stats.warmup_windows(series))
    assert 3 <= statistics.median(found) <= 7
    assert max(found) <= 10  # never more than half


def test_warmup_detection_keeps_a_stationary_series() -> None:
    rng = random.Random(4)
    found = [stats.warmup_windows([rng.gauss(500, 10) for _ in range(20)]) for _ in range(200)]
    assert min(found) == 1  # the first window always goes
    assert statistics.mean(found) < 3.5
    # and the steady mean of a stationary series is unbiased
    means = [statistics.fmean(stats.steady([rng.gauss(500, 10) for _ in range(20)]))
             for _ in range(300)]
    assert statistics.fmean(means) == pytest.approx(500, abs=1.0)


def test_warmup_edge_cases() -> None:
    assert stats.warmup_windows([]) == 0
    assert stats.warmup_windows([1.0]) == 0
    assert stats.warmup_windows([1.0, 2.0]) == 1
    assert stats.steady([float("nan"), 1.0, 2.0, 2.0, 2.0]) == [2.0, 2.0, 2.0]


def test_decision_rules() -> None:
    base = stats.Interval(100, 95, 105, 10)
    assert stats.cannot_win(stats.Interval(80, 75, 94, 10), base)
    assert not stats.cannot_win(stats.Interval(80, 75, 96, 10), base)
    assert stats.is_win(stats.Interval(1.3, 1.06, 1.5, 20), 0.05)
    assert not stats.is_win(stats.Interval(1.3, 1.04, 1.5, 20), 0.05)
