"""What a training run's summary says (``gradinv train``'s summary.json): its accuracy, how far
one evaluation moves from the next, and CENSOR's shares of raw and fallback updates.

Read by the training job itself, to log the run to MLflow, and by the reports that tabulate the
runs (:mod:`gradinv.stages.utility`, :mod:`gradinv.stages.convergence`). It imports nothing
heavy: a training job that loads the report's tables and figures pays seconds for them.
"""

from __future__ import annotations

import statistics
from typing import Any


def final_accuracy(summary: dict[str, Any], last: int) -> tuple[float | None, int | None]:
    """Test accuracy (%) of a finished run, the mean of its ``last`` evaluations, and the last
    evaluated round; None if it failed."""
    evals = _last_evaluations(summary, last)
    if summary["status"] != "ok" or not evals:
        return None, None
    mean = sum(float(p["test_accuracy"]) for p in evals) / len(evals)
    return 100.0 * mean, int(evals[-1]["round"])


def _last_evaluations(summary: dict[str, Any], last: int) -> list[dict[str, Any]]:
    return [p for p in summary["history"] if "test_accuracy" in p][-last:]


def defense_rates(summary: dict[str, Any]) -> dict[str, float | None]:
    """Over a whole training run, CENSOR's share of client updates that were the raw gradient
    (``raw_gradient_rate``: Algorithm 1's fallback) and in which no candidate beat the
    undefended loss (``fallback_rate``); None for a defense that counts neither. Per round they
    are in the run's history (and MLflow)."""
    stats = summary.get("defense_stats") or {}
    updates = stats.get("updates")
    if not updates or "fallbacks" not in stats:
        return {"raw_gradient_rate": None, "fallback_rate": None}
    return {
        "raw_gradient_rate": stats.get("raw_shared", 0) / updates,
        "fallback_rate": stats["fallbacks"] / updates,
    }


def accuracy_spread(summary: dict[str, Any], last: int) -> float | None:
    """The sample standard deviation (percentage points) of the ``last`` evaluations that
    :func:`final_accuracy` averages: how far one run's reading moves from one evaluation to the
    next."""
    evals = [float(p["test_accuracy"]) for p in _last_evaluations(summary, last)]
    if summary["status"] != "ok" or len(evals) < 2:
        return None
    return 100.0 * statistics.stdev(evals)
