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


def test_a_rate_interval_is_the_t_interval_of_the_logs_and_stays_positive() -> None:
    rates = [7149.0, 32362.0]  # two runs 4.5x apart: the plain interval goes below zero
    assert stats.mean_interval(rates, 0.95).low < 0
    iv = stats.rate_interval(rates, 0.95)
    logs = [math.log(r) for r in rates]
    half = 12.706205 * statistics.stdev(logs) / math.sqrt(2)  # t(0.975, 1)
    assert iv.estimate == pytest.approx(math.sqrt(rates[0] * rates[1]))
    assert iv.low == pytest.approx(math.exp(statistics.fmean(logs) - half), rel=1e-5)
    assert iv.high == pytest.approx(math.exp(statistics.fmean(logs) + half), rel=1e-5)
    assert iv.low > 0 and stats.rate_interval([0.0, 1.0]) == stats.mean_interval([0.0, 1.0])


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


def _windows(rates: list[float], steps: int = 5, batch: int = 32, pause: float = 0.0,
             start: float = 100.0) -> list[stats.WindowFigure]:
    """Windows of `steps` steps at the given samples/s, `pause` s between windows."""
    out, t = [], start
    for i, rate in enumerate(rates):
        busy = steps * batch / rate
        t += busy + pause
        out.append(stats.WindowFigure((i + 1) * steps, steps * batch, busy, t))
    return out


def test_run_rates_drop_warmup_and_count_pauses_in_wall_time() -> None:
    rates = [200.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0]
    windows = _windows(rates, pause=0.04)
    figures = stats.run_rates(windows)
    kept = windows[1:]  # MSER drops the slow first window only
    samples = sum(w.samples for w in kept)
    assert figures["step"] == pytest.approx(1000.0)
    assert figures["wall"] == pytest.approx(samples / (kept[-1].time - windows[0].time))
    assert figures["wall"] == pytest.approx(160 / (0.16 + 0.04))  # 160 samples per 0.2 s
    assert stats.run_rates(windows[:1]) == {}


def test_pooled_sd_is_the_anova_within_group_sd() -> None:
    groups = [[0.1, 0.3, 0.2], [1.0, 1.4], [5.0]]
    sd, df = stats.pooled_sd(groups)
    ss = 2 * statistics.variance(groups[0]) + 1 * statistics.variance(groups[1])
    assert df == 3 and sd == pytest.approx(math.sqrt(ss / 3))
    assert stats.pooled_sd([[1.0]]) == (pytest.approx(math.nan, nan_ok=True), 0)


def test_arm_interval_covers_the_true_ratio_at_its_level() -> None:
    rng = random.Random(5)
    sigma, reps, hits = 0.12, 2000, 0
    for _ in range(reps):
        placebo = [rng.gauss(0, sigma) for _ in range(3)]
        arm = [rng.gauss(math.log(1.4), sigma) for _ in range(2)]
        sd, df = stats.pooled_sd([placebo, arm])
        iv = stats.arm_interval(arm, sd, df, 0.95)
        hits += iv.low <= 1.4 <= iv.high
    assert 0.93 <= hits / reps <= 0.97
    iv = stats.arm_interval([0.1, 0.3], 0.1, 4, 0.95)
    half = 2.776445 * 0.1 / math.sqrt(2)  # t(0.975, 4)
    assert iv.estimate == pytest.approx(math.exp(0.2))
    assert iv.low == pytest.approx(math.exp(0.2 - half)) and iv.n == 2
    assert stats.arm_interval([0.2], math.nan, 0).high == math.inf


def test_combine_adds_log_ratios_and_their_variances() -> None:
    a, b = stats.Interval(1.5, 1.2, 1.9, 2), stats.Interval(1.2, 1.0, 1.4, 3)
    iv = stats.combine([a, b], 0.1, 6)
    half = 2.446912 * 0.1 * math.sqrt(1 / 2 + 1 / 3)  # t(0.975, 6)
    assert iv.estimate == pytest.approx(1.8)
    assert math.log(iv.high) - math.log(iv.estimate) == pytest.approx(half)


def test_decision_rules() -> None:
    # a placebo whose interval covers 1 shows no bias: the floor is 1 + min_gain (its
    # spread is in the pooled noise of every arm's own interval already)
    assert stats.noise_floor(stats.Interval(1.01, 0.9, 1.12, 3), 0.05) == 1.05
    assert stats.noise_floor(stats.Interval(1.01, 0.4, 2.5, 3), 0.05) == 1.05
    # one that excludes 1 is a bias of the machine: the floor rises to it, either side
    # (an A/A ratio has no direction)
    assert stats.noise_floor(stats.Interval(1.2, 1.1, 1.3, 3), 0.05) == 1.2
    low_side = stats.noise_floor(stats.Interval(0.75, 0.6, 0.94, 3), 0.05)
    assert low_side == pytest.approx(1 / 0.75)
    assert stats.noise_floor(None) == math.inf
    assert stats.noise_floor(stats.Interval(1.0, 0.0, math.inf, 1)) == math.inf  # df 0
    assert stats.share_confidence(0.95, 1.0) == pytest.approx(0.95)
    assert stats.share_confidence(0.95, 0.25) == pytest.approx(0.9875)
    floor = 1.12
    assert stats.judge(stats.Interval(1.5, 1.2, 1.8, 2), floor) == "win"
    assert stats.judge(stats.Interval(1.5, 1.2, 1.8, 1), floor) == "win"  # sequential: one pair
    assert stats.judge(stats.Interval(1.5, 1.2, 1.8, 1), floor, min_pairs=2) == "more"
    # the look's interval decides a win; the nominal one, a loss
    assert stats.judge(stats.Interval(1.5, 1.0, 2.2, 2), floor,
                       nominal=stats.Interval(1.5, 1.05, 1.1, 2)) == "lose"
    assert stats.judge(stats.Interval(1.0, 0.9, 1.11, 1), floor) == "lose"
    assert stats.judge(stats.Interval(1.1, 1.0, 1.2, 3), floor, max_pairs=4) == "more"
    assert stats.judge(stats.Interval(1.1, 1.0, 1.2, 4), floor, max_pairs=4) == "undecided"


def test_look_confidence_splits_the_error_over_the_looks() -> None:
    looks = [stats.look_confidence(0.95, 4, k) for k in range(1, 5)]
    assert looks == pytest.approx([0.975, 1 - 0.025 / 3, 1 - 0.025 / 3, 1 - 0.025 / 3])
    assert sum(1 - c for c in looks) == pytest.approx(0.05)  # the union bound holds
    assert stats.look_confidence(0.95, 1) == pytest.approx(0.95)


def test_the_placebo_counts_around_zero_in_the_pooled_noise() -> None:
    sd, df = stats.pooled_sd([[0.1, 0.3]], zero_mean=[[0.2, -0.2]])
    assert df == 3  # 1 from the arm around its mean, 2 from the placebo around zero
    assert sd == pytest.approx(math.sqrt((0.01 + 0.01 + 0.04 + 0.04) / 3))
