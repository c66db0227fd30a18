"""Experiment statistics on synthetic data with known answers: t quantiles
against published tables, interval coverage of draws from known
distributions, and the verdict's direction / no-difference logic."""
import math
import random

import pytest

from inference.benchmarks import stats

# Two-sided 95% critical values (t_{0.975, df}) from standard tables.
T_TABLE = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 10: 2.2281, 20: 2.0860,
           30: 2.0423, 120: 1.9799}


@pytest.mark.parametrize("df,expected", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_published_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_other_levels_and_symmetry():
    assert stats.t_quantile(0.95, 5) == pytest.approx(2.0150, abs=5e-4)
    assert stats.t_quantile(0.995, 3) == pytest.approx(5.8409, abs=5e-4)
    assert stats.t_quantile(0.025, 10) == pytest.approx(-2.2281, abs=5e-4)
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-4)
    # fractional df (Welch) lies between its neighbours
    assert stats.t_quantile(0.975, 4) > stats.t_quantile(0.975, 4.5) > stats.t_quantile(0.975, 5)
    assert stats.t_cdf(0.0, 7) == pytest.approx(0.5)


def test_mean_ci_of_a_known_sample():
    ci = stats.mean_ci([10.0, 12.0, 14.0])
    # mean 12, sd 2, half-width 4.3027 * 2 / sqrt(3)
    assert ci.mean == pytest.approx(12.0)
    assert ci.sd == pytest.approx(2.0)
    assert ci.half_width == pytest.approx(4.3027 * 2 / math.sqrt(3), rel=1e-4)


def test_one_value_has_no_interval_and_bad_values_are_ignored():
    ci = stats.mean_ci([5.0, None, float("nan"), "x"])
    assert ci.n == 1 and ci.low is None
    assert stats.mean_ci([]) is None
    assert stats.ratio_ci([1.0], [2.0]).has_interval is False
    assert stats.classify(stats.ratio_ci([1.0], [2.0]), "higher") == "unknown"
    assert stats.ratio_ci([0.0, 0.0], [1.0, 2.0]) is None  # a ratio to nothing means nothing


def test_ratio_interval_is_symmetric_in_a_and_b():
    a, b = [10.0, 11.0, 9.5, 10.4], [27.0, 26.0, 28.5]
    ab, ba = stats.ratio_ci(a, b), stats.ratio_ci(b, a)
    assert ab.ratio == pytest.approx(1 / ba.ratio)
    assert ab.low == pytest.approx(1 / ba.high)
    assert ab.high == pytest.approx(1 / ba.low)


def _coverage(true_ratio, sd_a, sd_b, n, trials=1500, seed=7):
    rng = random.Random(seed)
    hits = 0
    for _ in range(trials):
        a = [rng.gauss(100.0, sd_a) for _ in range(n)]
        b = [rng.gauss(100.0 * true_ratio, sd_b) for _ in range(n)]
        r = stats.ratio_ci(a, b)
        hits += r.low <= true_ratio <= r.high
    return hits / trials


@pytest.mark.parametrize("true_ratio,sd_a,sd_b,n", [(2.7, 5.0, 12.0, 3), (1.0, 3.0, 3.0, 5), (0.6, 8.0, 2.0, 10)])
def test_ratio_interval_covers_the_true_ratio_about_95_percent_of_the_time(true_ratio, sd_a, sd_b, n):
    coverage = _coverage(true_ratio, sd_a, sd_b, n)
    assert 0.92 <= coverage <= 0.985, coverage


def test_mean_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = random.Random(3)
    hits = 0
    for _ in range(2000):
        ci = stats.mean_ci([rng.gauss(50.0, 4.0) for _ in range(4)])
        hits += ci.low <= 50.0 <= ci.high
    assert 0.93 <= hits / 2000 <= 0.97


def test_direction_and_no_difference_logic():
    rng = random.Random(11)
    a = [rng.gauss(30.0, 1.0) for _ in range(5)]
    faster = [rng.gauss(81.0, 2.0) for _ in range(5)]   # 2.7x
    same = [rng.gauss(30.0, 1.0) for _ in range(5)]
    # a throughput: higher is better
    assert stats.classify(stats.ratio_ci(a, faster), "higher") == "better"
    assert stats.classify(stats.ratio_ci(faster, a), "higher") == "worse"
    # a latency: higher is worse
    assert stats.classify(stats.ratio_ci(a, faster), "lower") == "worse"
    assert stats.classify(stats.ratio_ci(faster, a), "lower") == "better"
    # same distribution: the interval includes 1.0
    r = stats.ratio_ci(a, same)
    assert r.low <= 1.0 <= r.high
    assert stats.classify(r, "higher") == "same"


def test_identical_values_give_a_zero_width_interval():
    r = stats.ratio_ci([10.0, 10.0], [20.0, 20.0])
    assert (r.low, r.ratio, r.high) == (2.0, 2.0, 2.0)
    assert stats.classify(r, "higher") == "better"
