"""Intervals for noisy measurements: a table cell over its victims, a paired difference over the
same victims (or the same seeds), and the verdict such an interval supports.

Three intervals, each where it fits:

- **A cell's mean over its victims**: the percentile bootstrap (``scipy.stats.bootstrap``),
  :data:`RESAMPLES` resamples from a generator seeded by the cell's key, so a table renders to
  the same bytes twice. Descriptive: it says how far the cell's mean could move with other
  victims of the same kind. Undefined for one victim.
- **A paired difference over victims** (the same victim under two defenses, two attacks, two
  rounds): the exact sign-flip interval of the mean difference. Under the null hypothesis that
  the difference is symmetric about δ, every pattern of signs of the n differences d_i − δ is
  equally likely; the interval is every δ that this permutation test (``scipy.stats.
  permutation_test``'s one-sample ``samples`` permutations, enumerated here with numpy for
  speed and checked against it in the tests) does not reject at 5%, two-sided. It needs no
  normality, and it is honest for few victims: with n ≤ 5 no sign pattern is rare enough
  (2/2^5 > 0.05), so the interval is the whole line and nothing is decided. Beyond
  :data:`EXACT_MAX` victims a seeded random subset of :data:`RESAMPLES` patterns stands in for
  all of them, the observed pattern counted among them (a p-value is never 0).
- **A paired difference over seeds** (training runs of two defenses with the same seeds): the
  paired t-interval. Three to five seeds are too few for a permutation interval (no pattern of
  3 signs has probability below 0.05), and a run's accuracy, an average over many evaluations,
  is close enough to normal for the t-interval.

:func:`verdict` turns an interval into **holds**, **fails** or **inconclusive** for a relation
(less, greater, within, not_below) and a tolerance; for an inconclusive one,
:func:`units_to_decide` estimates how many victims or seeds would decide it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000
EXACT_MAX = 16  # 2^16 sign patterns enumerated; beyond, RESAMPLES random ones
# The fewest victims a sign-flip interval can decide with: the two most extreme of the 2^n sign
# patterns must be rarer than 1 - LEVEL (2 / 2^6 = 0.031).
SIGN_FLIP_MIN = next(n for n in range(1, 64) if 2 / 2**n <= 1 - LEVEL)
POWER = 0.8  # the chance of deciding that units_to_decide plans for
# Beyond this many units, no estimate: the mean is practically on the boundary
PLANNING_MAX = 10_000


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval, the number of units behind it and how it was made."""

    estimate: float
    low: float
    high: float
    n: int
    method: str

    @property
    def decided(self) -> bool:
        return math.isfinite(self.low) or math.isfinite(self.high)


def seed_of(*key: object) -> int:
    """A stable 64-bit seed from a key (not Python's salted ``hash``)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def bootstrap_mean(values: Sequence[float], *key: object) -> tuple[float, float]:
    """The percentile-bootstrap 95% interval of the mean of ``values``, seeded by ``key``; NaN
    for fewer than two values. An exact reconstruction's +inf (PSNR) stays in: resamples without
    it have a finite mean, those with it an infinite one, and the bounds say how many are."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed_of(*key))
    if np.isinf(x).any():  # scipy's percentile interpolation would turn inf - inf into NaN
        means = x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))].mean(axis=1)
        low, high = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], method="inverted_cdf")
        return float(low), float(high)
    from scipy import stats  # here: a heavy import that the tables' readers need not pay

    result = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=RESAMPLES,
        confidence_level=LEVEL,
        method="percentile",
        random_state=rng,
        vectorized=True,
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@cache
def _all_signs(n: int) -> np.ndarray:
    """Every pattern of n signs with the first one +1, (2^(n-1), n): a pattern and its negation
    give the same |mean|, so half of them give the whole null distribution of it."""
    codes = np.arange(2 ** (n - 1))[:, None] >> np.arange(n - 1)[None, :] & 1
    rest = (1 - 2 * codes).astype(np.float64)
    return np.hstack([np.ones((len(rest), 1)), rest])


def _signs(n: int, seed: int) -> np.ndarray:
    if n <= EXACT_MAX:
        return _all_signs(n)
    rng = np.random.default_rng(seed)
    return rng.choice([-1.0, 1.0], size=(RESAMPLES, n))


def sign_flip_pvalue(differences: Sequence[float], delta: float = 0.0, seed: int = 0) -> float:
    """The two-sided p-value of the sign-flip test of "the differences are symmetric about
    ``delta``": the share of sign patterns whose mean is at least as far from 0 as the
    observed mean of ``differences - delta``."""
    d = np.asarray(differences, dtype=np.float64) - delta
    signs = _signs(len(d), seed)
    null = np.abs(signs @ d) / len(d)
    observed = abs(d.mean())
    extreme = int(np.count_nonzero(null >= observed * (1 - 1e-12) - 1e-15))
    if len(d) <= EXACT_MAX:
        return extreme / len(null)
    # A random subset of the patterns: the observed one is counted among them, so that the
    # p-value is never 0 and the test keeps its level (Phipson and Smyth, "Permutation
    # p-values should never be zero", 2010; scipy's permutation_test counts it so too).
    return (extreme + 1) / (len(null) + 1)


def paired_victims(left: Sequence[float], right: Sequence[float], *key: object) -> Interval:
    """The mean of ``left - right`` over the same victims and its exact sign-flip 95% interval
    (module docstring); (-inf, inf) when no sign pattern is rare enough to decide."""
    d = np.asarray(left, dtype=np.float64) - np.asarray(right, dtype=np.float64)
    n = len(d)
    method = "sign-flip (exact)" if n <= EXACT_MAX else f"sign-flip ({RESAMPLES} random patterns)"
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, method)
    if not np.isfinite(d).all():
        raise ValueError(
            "paired differences must be finite (an exact reconstruction on both sides)"
        )
    seed, alpha = seed_of(*key), 1 - LEVEL
    estimate = float(d.mean())
    if sign_flip_pvalue(d, estimate, seed) <= alpha:  # cannot happen: the mean is never rejected
        return Interval(estimate, estimate, estimate, n, method)
    # the first step out: the differences' range, never below what float64 can resolve
    spread = max(float(np.ptp(d)), 1e-9 * max(1.0, abs(estimate)))
    bounds = []
    for direction in (-1.0, 1.0):
        inner, outer = estimate, estimate + direction * spread
        for _ in range(60):  # find a rejected δ, doubling the step: none means no bound
            if sign_flip_pvalue(d, outer, seed) <= alpha:
                break
            inner, outer = outer, estimate + 2 * (outer - estimate)
        else:
            bounds.append(direction * math.inf)
            continue
        for _ in range(48):  # bisect between the last accepted and the first rejected δ
            middle = (inner + outer) / 2
            if sign_flip_pvalue(d, middle, seed) <= alpha:
                outer = middle
            else:
                inner = middle
        bounds.append(_at_a_tie(d, inner, spread, seed))
    return Interval(estimate, bounds[0], bounds[1], n, method)


def _at_a_tie(d: np.ndarray, bound: float, spread: float, seed: int) -> float:
    """``bound``, or the difference it lies on. Where δ passes one of the differences, that
    difference turns to 0 and the p-value jumps (ties: Imprint's exact reconstructions under
    both defenses give differences of 0, whose interval ends at 0). The test's tolerance for
    ties keeps δ accepted for about 1e-12 beyond such a difference, and bisection stops there:
    an end within float resolution of an accepted difference is that difference, not 1e-12.
    Where every difference is the same (under Soteria, Imprint reads every batch back as it
    does without a defense: all 0), the step out is only 1e-9 and the tolerance's own 1e-15 is
    most of the distance, hence the absolute term."""
    nearest = float(d[np.argmin(np.abs(d - bound))])
    tolerance = 1e-9 * spread + 1e-12 * max(1.0, abs(nearest))
    if abs(bound - nearest) <= tolerance and sign_flip_pvalue(d, nearest, seed) > 1 - LEVEL:
        return nearest
    return bound


def paired_seeds(left: Sequence[float], right: Sequence[float]) -> Interval:
    """The mean of ``left - right`` over the same seeds and its paired t 95% interval."""
    d = np.asarray(left, dtype=np.float64) - np.asarray(right, dtype=np.float64)
    n = len(d)
    if n < 2:
        estimate = float(d.mean()) if n else math.nan
        return Interval(estimate, -math.inf, math.inf, n, "paired t")
    estimate = float(d.mean())
    half = _t_quantile(n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
    return Interval(estimate, estimate - half, estimate + half, n, "paired t")


def mean_over_seeds(values: Sequence[float]) -> Interval:
    """The mean over seeds and its t 95% interval (NaN bounds for one seed)."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "t")
    estimate = float(x.mean())
    if n < 2:
        return Interval(estimate, math.nan, math.nan, n, "t")
    half = _t_quantile(n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(estimate, estimate - half, estimate + half, n, "t")


def _t_quantile(dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf((1 + LEVEL) / 2, dof))


def units_to_decide(
    differences: Sequence[float],
    relation: str,
    tolerance: float = 0.0,
    minimum: int = 2,
    sign_flip: bool = False,
) -> int | None:
    """How many victims (or seeds) in all would decide a comparison that is inconclusive now:
    the smallest n, at least ``minimum``, at which the 95% interval of the mean paired
    difference would clear a decision boundary of ``relation`` (see :func:`verdict`) with
    probability :data:`POWER`, if the differences' mean and standard deviation are what this
    sample shows. The power is the paired t-test's, from the noncentral t distribution: one
    boundary (greater, less, not_below, and ``within`` where the mean lies outside the
    tolerance), or both at once (``within`` where it lies inside: the interval must fit
    between them). With ``sign_flip`` (the exact interval over victims) at its fewest victims,
    :data:`SIGN_FLIP_MIN`, every difference must fall on the claimed side of the boundary, a
    chance of Φ(δ/s)^n for differences normal around the observed mean; from one victim more
    the t-test's power is close to the sign-flip interval's.

    A planning figure, not a promise: another sample moves the mean. None where it cannot be
    estimated: fewer than 2 differences (no spread), or a mean so close to the boundary that
    more than :data:`PLANNING_MAX` would be needed."""
    d = np.asarray(differences, dtype=np.float64)
    if len(d) < 2 or not np.isfinite(d).all():
        return None
    mean, spread = float(d.mean()), float(d.std(ddof=1))
    distances = _distances(mean, relation, tolerance)
    nearest = min(distances)
    minimum = max(minimum, 2)
    if spread == 0.0:  # every repetition gives the same difference: decided once decidable
        inclusive = (
            relation in ("within", "not_below")
            and verdict(Interval(mean, mean, mean, len(d), "t"), relation, tolerance) == "holds"
        )
        return minimum if nearest > 0 or inclusive else None
    from scipy import stats

    z = stats.norm.ppf((1 + LEVEL) / 2) + stats.norm.ppf(POWER)
    if nearest == 0.0 or z * spread / nearest > math.sqrt(PLANNING_MAX):
        return None

    def power(n: int) -> float:  # the paired t-test's: increasing in n
        t = stats.t.ppf((1 + LEVEL) / 2, n - 1)
        sides = [stats.nct.sf(t, n - 1, math.sqrt(n) * dist / spread) for dist in distances]
        return float(sum(sides) - (len(sides) - 1))

    # the normal approximation for the nearest boundary is a lower bound
    n = max(minimum, math.ceil((z * spread / nearest) ** 2))
    if sign_flip and n == SIGN_FLIP_MIN:
        # all n differences beyond the boundary (for within with the mean inside, not planned)
        if len(distances) == 1 and stats.norm.cdf(nearest / spread) ** n >= POWER:
            return n
        n += 1
    low, high = n, n  # double, then bisect
    while power(high) < POWER:
        if high > PLANNING_MAX:
            return None
        low, high = high + 1, 2 * high
    while low < high:
        middle = (low + high) // 2
        if power(middle) >= POWER:
            high = middle
        else:
            low = middle + 1
    return high if high <= PLANNING_MAX else None


def _distances(mean: float, relation: str, tolerance: float) -> list[float]:
    """The mean's distance to each boundary that an interval must clear to decide the
    relation (:func:`verdict`): one, or two for ``within`` with the mean inside."""
    if relation == "within":
        if abs(mean) < tolerance:
            return [tolerance - mean, tolerance + mean]
        return [abs(mean) - tolerance]
    if relation == "greater":
        return [abs(mean - tolerance)]
    if relation in ("less", "not_below"):
        return [abs(mean + tolerance)]
    raise ValueError(f"unknown relation {relation!r}")


def verdict(interval: Interval, relation: str, tolerance: float = 0.0) -> str:
    """holds / fails / inconclusive for ``left - right`` (the interval) under ``relation``:

    - ``greater`` (left − right > tolerance): holds when the interval lies above the tolerance,
      fails when it lies below it; ``less`` the mirror image.
    - ``within`` (|left − right| ≤ tolerance): holds when the interval lies inside
      [−tolerance, tolerance], fails when it lies wholly outside.
    - ``not_below`` (left ≥ right − tolerance): holds when the interval lies at or above
      −tolerance, fails when it lies below it.
    """
    low, high = interval.low, interval.high
    if interval.n == 0 or math.isnan(low) or math.isnan(high):
        return "inconclusive"
    if relation == "greater":
        return "holds" if low > tolerance else "fails" if high < tolerance else "inconclusive"
    if relation == "less":
        return "holds" if high < -tolerance else "fails" if low > -tolerance else "inconclusive"
    if relation == "within":
        if -tolerance <= low and high <= tolerance:
            return "holds"
        return "fails" if low > tolerance or high < -tolerance else "inconclusive"
    if relation == "not_below":
        return "holds" if low >= -tolerance else "fails" if high < -tolerance else "inconclusive"
    raise ValueError(f"unknown relation {relation!r}")
