"""The intervals behind every cell and verdict (gradinv.stats), checked against scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from gradinv.stats import (
    Interval,
    bootstrap_mean,
    mean_over_seeds,
    paired_seeds,
    paired_victims,
    sign_flip_pvalue,
    verdict,
)


@pytest.mark.parametrize("n", [3, 6, 11])
def test_the_sign_flip_pvalue_is_scipys_exact_permutation_test(n):
    d = np.random.default_rng(n).normal(0.3, 1.0, n)
    for delta in (0.0, 0.3, -0.5):
        expected = stats.permutation_test(
            (d - delta,), np.mean, vectorized=True, permutation_type="samples", n_resamples=np.inf
        ).pvalue
        assert sign_flip_pvalue(d, delta) == pytest.approx(expected)


def test_the_paired_interval_is_the_set_of_differences_the_test_keeps():
    rng = np.random.default_rng(0)
    left, right = rng.normal(1.0, 1.0, 12), rng.normal(0.0, 1.0, 12)
    iv = paired_victims(left, right, "cell")
    d = left - right
    assert iv.estimate == pytest.approx(d.mean()) and iv.n == 12
    assert iv.low < iv.estimate < iv.high
    eps = 1e-6 * (iv.high - iv.low)
    for bound, outward in ((iv.low, -eps), (iv.high, eps)):
        assert sign_flip_pvalue(d, bound - outward) > 0.05  # just inside: kept
        assert sign_flip_pvalue(d, bound + outward) <= 0.05  # just outside: rejected
    assert paired_victims(left, right, "cell") == iv  # seeded: the same twice


def test_five_victims_or_fewer_decide_nothing_however_consistent():
    # 2 / 2^5 > 0.05: no sign pattern is rare enough, so the interval is the whole line
    for n in (2, 5):
        iv = paired_victims([1.0 + 0.01 * i for i in range(n)], [0.0] * n, "x")
        assert (iv.low, iv.high) == (-math.inf, math.inf) and not iv.decided
        assert verdict(iv, "greater") == "inconclusive"
    six = paired_victims([1.0 + 0.01 * i for i in range(6)], [0.0] * 6, "x")
    assert six.low > 0 and verdict(six, "greater") == "holds"


def test_many_victims_use_seeded_random_sign_patterns():
    rng = np.random.default_rng(3)
    left, right = rng.normal(0.5, 1.0, 40), rng.normal(0.0, 1.0, 40)
    iv = paired_victims(left, right, "big")
    assert "random" in iv.method and iv.low < iv.estimate < iv.high
    assert paired_victims(left, right, "big") == iv


def test_the_seed_interval_is_the_paired_t_interval():
    left, right = [44.0, 47.5, 46.0, 41.0], [40.0, 42.0, 45.5, 39.0]
    iv = paired_seeds(left, right)
    ci = stats.ttest_rel(left, right).confidence_interval(0.95)
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high))
    one = mean_over_seeds([40.0, 42.0, 45.0])
    ci = stats.ttest_1samp([40.0, 42.0, 45.0], 0.0).confidence_interval(0.95)
    assert (one.low, one.high) == pytest.approx((ci.low, ci.high))
    assert paired_seeds([1.0], [0.0]).decided is False  # one seed: no interval


def test_the_bootstrap_interval_of_a_cell():
    assert all(math.isnan(v) for v in bootstrap_mean([3.0], "c"))
    assert bootstrap_mean([2.0, 2.0, 2.0], "c") == (2.0, 2.0)
    low, high = bootstrap_mean([1.0, 2.0, 3.0, 10.0], "c")
    assert 1.0 <= low < 4.0 < high <= 10.0
    assert bootstrap_mean([1.0, 2.0, 3.0, 10.0], "c") == (low, high)  # seeded by its key
    values = np.random.default_rng(1).normal(size=12).tolist()
    assert bootstrap_mean(values, "c") != bootstrap_mean(values, "other cell")


@pytest.mark.parametrize(
    ("low", "high", "relation", "tolerance", "expected"),
    [
        (0.5, 2.0, "greater", 0.0, "holds"),
        (-2.0, -0.5, "greater", 0.0, "fails"),
        (-0.5, 2.0, "greater", 0.0, "inconclusive"),
        (0.5, 2.0, "greater", 1.0, "inconclusive"),  # above 0, not surely above the tolerance
        (-2.0, -0.5, "less", 0.0, "holds"),
        (0.1, 0.5, "less", 0.0, "fails"),
        (-0.5, 0.8, "within", 1.0, "holds"),
        (1.5, 3.0, "within", 1.0, "fails"),
        (0.5, 3.0, "within", 1.0, "inconclusive"),
        (-1.5, 1.0, "not_below", 2.0, "holds"),
        (-9.0, -3.0, "not_below", 2.0, "fails"),
        (-3.0, 1.0, "not_below", 2.0, "inconclusive"),
        (-math.inf, math.inf, "less", 0.0, "inconclusive"),
    ],
)
def test_a_verdict_reads_the_interval_against_the_claimed_side(
    low, high, relation, tolerance, expected
):
    iv = Interval((low + high) / 2 if math.isfinite(low + high) else 0.0, low, high, 8, "t")
    assert verdict(iv, relation, tolerance) == expected
