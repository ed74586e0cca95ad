"""The intervals behind every cell and verdict (gradinv.stats), checked against scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from gradinv.stats import (
    EXACT_MAX,
    RESAMPLES,
    Interval,
    bootstrap_mean,
    mean_over_seeds,
    paired_seeds,
    paired_victims,
    sign_flip_pvalue,
    units_to_decide,
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


def test_an_interval_that_ends_on_a_tie_ends_exactly_there():
    """Differences of 0 (Imprint reads an image back exactly under both defenses): δ = 0 is kept
    (p 0.5), any δ above it rejected (p 1/128), so the interval ends at 0, not at the 1e-12 up to
    which the test's tolerance for ties still keeps δ."""
    d = [-1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert sign_flip_pvalue(d, 0.0) > 0.05 and sign_flip_pvalue(d, 1e-9) <= 0.05
    iv = paired_victims(d, [0.0] * 8, "tie")
    assert iv.high == 0.0 and iv.low == pytest.approx(-2 / 3)
    assert verdict(iv, "less") == "inconclusive"  # 0 is in the interval
    mirrored = paired_victims([0.0] * 8, d, "tie")
    assert mirrored.low == 0.0 and verdict(mirrored, "not_below") == "holds"


@pytest.mark.parametrize("n", [8, 24])  # every sign pattern, then random ones
@pytest.mark.parametrize("value", [0.0, 2.5])
def test_identical_differences_give_an_interval_of_zero_width(n, value):
    """Every victim the same difference (Soteria at 1% leaves Imprint's reconstructions as they
    are without a defense: all 0): any other δ is rejected (p 1/2^(n-1), or about 1e-4 from
    random patterns), so the interval is that one value, not ±1.7e-15 around it."""
    iv = paired_victims([value] * n, [0.0] * n, "same")
    assert (iv.low, iv.estimate, iv.high) == (value, value, value)
    assert verdict(iv, "less") == ("fails" if value else "inconclusive")
    assert verdict(iv, "within", 1.0) == ("fails" if value else "holds")


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


def test_a_random_pattern_pvalue_counts_the_observed_pattern():
    """Beyond EXACT_MAX victims the patterns are a random subset: p is (extreme + 1) / (R + 1),
    never 0, so that the test keeps its level."""
    d = np.full(40, 2.0) + np.random.default_rng(5).normal(0.0, 0.1, 40)  # all far above 0
    assert sign_flip_pvalue(d, 0.0) == 1 / (RESAMPLES + 1)
    assert sign_flip_pvalue(d, float(d.mean())) == 1.0  # at the mean, every pattern is as far
    small = d[:EXACT_MAX]  # enumerated: the two all-same-sign patterns of 2^16 are as far
    assert sign_flip_pvalue(small, 0.0) == 2 / 2**EXACT_MAX


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


def test_units_to_decide_is_the_paired_t_tests_sample_size():
    d = [1.2, -0.8, 2.5, 0.3, 1.9, -1.1, 0.9, 2.2]  # mean 0.8875, sd about 1.32
    n = units_to_decide(d, "greater")
    mean, sd = np.mean(d), np.std(d, ddof=1)

    def power(k):  # the one-sided power of the paired t-test at k pairs, noncentral t
        return stats.nct.sf(stats.t.ppf(0.975, k - 1), k - 1, math.sqrt(k) * mean / sd)

    assert power(n) >= 0.8 > power(n - 1)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert (z * sd / mean) ** 2 < n < (z * sd / mean) ** 2 + 5  # the normal formula, t-corrected
    assert units_to_decide(d, "greater", minimum=40) == 40


def test_units_to_decide_aims_at_each_relations_boundary():
    """The boundary of :func:`verdict`: +tolerance for greater, -tolerance for less and
    not_below, the nearer edge of [-tolerance, tolerance] for within."""
    d = np.array([1.2, -0.8, 2.5, 0.3, 1.9, -1.1, 0.9, 2.2])
    n = units_to_decide(d, "greater")
    assert units_to_decide(-d, "less") == n  # the mirror image
    assert units_to_decide(-d, "less", tolerance=0.5) == units_to_decide(d, "greater", 0.5) > n
    assert units_to_decide(d, "not_below", tolerance=2.0) == units_to_decide(d + 2.0, "greater")
    assert units_to_decide(d, "greater", tolerance=-2.0) == units_to_decide(d + 2.0, "greater")
    # within, the mean outside the tolerance: one boundary, |mean| - tolerance away
    assert units_to_decide(d, "within", tolerance=0.3) == units_to_decide(d - 0.3, "greater")
    # within, the mean inside: the interval must fit between both edges, harder than one
    centred = d - d.mean() + 0.1
    inside = units_to_decide(centred, "within", tolerance=1.5)
    assert inside > units_to_decide(centred - 1.5, "less")


@pytest.mark.parametrize(
    ("d", "relation", "tolerance"),
    [
        ([0.0, 2.0, 1.0, 3.0, -1.0], "greater", 0.0),  # mean 1, sd 1.58
        ([0.3, -0.9, 1.1, -0.2, 0.4], "within", 1.0),  # mean 0.14 inside: both edges
    ],
)
def test_units_to_decide_decides_that_often_at_the_planned_size(d, relation, tolerance):
    """Samples of the planned size from a normal with the observed mean and spread decide the
    comparison in about 80% of draws (the paired t-interval clears the boundary)."""
    n = units_to_decide(d, relation, tolerance)
    draws = np.random.default_rng(7).normal(np.mean(d), np.std(d, ddof=1), (3000, n))
    decided = [verdict(paired_seeds(x, np.zeros(n)), relation, tolerance) for x in draws]
    assert 0.76 < np.mean([v != "inconclusive" for v in decided]) < 0.86
    fewer = [
        verdict(paired_seeds(x[: n // 2], np.zeros(n // 2)), relation, tolerance)
        for x in draws[:1000]
    ]
    assert np.mean([v != "inconclusive" for v in fewer]) < 0.6  # half as many: far less often


def test_units_to_decide_at_the_fewest_victims_a_sign_flip_interval_decides_with():
    """At 6 victims the sign-flip interval decides only when all six differences lie beyond the
    boundary: a chance of Φ(δ/s)^6, lower than the t-test's power there."""
    rng = np.random.default_rng(1)
    d = rng.normal(0.0, 1.0, 4)
    d = (d - d.mean()) / d.std(ddof=1)  # mean 0, sd 1: shifted below
    assert units_to_decide(d + 1.6, "greater", minimum=6) == 6  # the t-test's power suffices
    assert stats.norm.cdf(1.6) ** 6 < 0.8
    assert units_to_decide(d + 1.6, "greater", minimum=6, sign_flip=True) == 7
    assert stats.norm.cdf(2.5) ** 6 >= 0.8
    assert units_to_decide(d + 2.5, "greater", minimum=6, sign_flip=True) == 6


def test_units_to_decide_says_when_it_cannot_estimate():
    assert units_to_decide([0.4], "greater") is None  # one pair: no spread
    assert units_to_decide([-1.0, 1.0, -2.0, 2.0], "greater") is None  # the mean on the boundary
    assert units_to_decide([-1.0, 1.0, -2.0, 2.01], "greater") is None  # beyond PLANNING_MAX
    assert units_to_decide([1.0, -1.0, 1e-160], "greater") is None  # no overflow either
    # no spread: the minimum, unless the mean sits on a boundary the relation excludes
    assert units_to_decide([0.5] * 4, "greater", minimum=6) == 6
    assert units_to_decide([0.0] * 4, "greater") is None
    assert units_to_decide([0.0] * 4, "within", minimum=6) == 6  # |0| <= 0 holds
    assert units_to_decide([-1.0] * 4, "not_below", tolerance=1.0, minimum=6) == 6
    with pytest.raises(ValueError, match="unknown relation"):
        units_to_decide([1.0, 2.0], "between")
