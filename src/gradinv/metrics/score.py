"""The one entry point the pipeline calls: score a batch of reconstructions against its originals.

Returns a flat dict, ready to be one job's metrics file (results are data: tables are rendered
from these files alone). For each requested metric ``m``: ``m`` (the mean over the batch's images,
after matching) and ``m_per_image`` (the values in the originals' order). Plus ``matching`` (the
permutation applied: ``recon[matching]`` was scored against ``orig``), ``label_accuracy`` and, for
metrics that can be unavailable (LPIPS), ``<m>_status``. An unavailable metric gives ``None``
values and a status ``"unavailable: <reason>"``, never a number in its place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import MetricSettings, Stats, check_images
from gradinv.metrics.labels import Labels, label_accuracy
from gradinv.metrics.matching import match_reconstructions


def batch_mean(values: list[float]) -> float:
    """The plain mean; one ``+inf`` (an exactly recovered image's PSNR) makes it ``+inf``."""
    return math.fsum(values) / len(values)


def score(
    recon: Tensor,
    orig: Tensor,
    *,
    metrics: Sequence[str],
    settings: MetricSettings,
    mean: Stats | None = None,
    std: Stats | None = None,
    predicted_labels: Labels | None = None,
    true_labels: Labels | None = None,
) -> dict[str, Any]:
    """Score reconstructions ``recon`` against originals ``orig``, both ``(N, C, H, W)`` in [0, 1]
    (more reconstructions than originals when only some of the shared batch is scored, as DCS²'s
    sensitive samples are: each original is then matched to its own reconstruction).

    ``metrics`` names registered metrics (``METRICS.available()``). ``mean``/``std`` (one entry
    per channel) are needed only with ``settings.space == "normalized"``. With
    ``settings.match`` and ``N > 1`` the reconstructions are first Hungarian-matched to the
    originals on ``settings.match_cost``; otherwise ``matching`` is the identity.
    ``label_accuracy`` is ``None`` when the attack inferred no labels (``predicted_labels`` is
    None, e.g. the threat model gave it the labels).
    """
    if isinstance(metrics, str):
        raise TypeError(f"metrics must be a list of names, not the string {metrics!r}.")
    names = list(metrics)
    if len(set(names)) != len(names):
        raise ValueError(f"metrics {names} names a metric twice.")
    chosen = {name: METRICS.get(name)() for name in names}  # unknown names fail here, with hints
    check_images(recon, orig, same_count=False)
    if predicted_labels is not None and true_labels is None:
        raise ValueError("predicted_labels were given without true_labels to compare them to.")

    if len(recon) > len(orig) and not settings.match:
        raise ValueError(
            f"{len(recon)} reconstructions for {len(orig)} originals: which one recovers which "
            "original must be matched (metrics.match: true)."
        )
    if settings.match and len(recon) > 1:
        perm = match_reconstructions(
            recon, orig, cost=settings.match_cost, settings=settings, mean=mean, std=std
        )
    else:
        perm = list(range(len(orig)))
    matched = recon[perm]

    result: dict[str, Any] = {"matching": perm}
    for name in METRICS:
        if METRICS.get(name).reports_status and name not in chosen:
            result[f"{name}_status"] = "not requested"
    for name, metric in chosen.items():
        values = metric.per_image(matched, orig, settings, mean, std)
        per_image = values.per_image
        result[name] = None if per_image is None else batch_mean(per_image)
        result[f"{name}_per_image"] = per_image
        if metric.reports_status:
            result[f"{name}_status"] = values.status
    result["label_accuracy"] = (
        None if predicted_labels is None else label_accuracy(predicted_labels, true_labels)
    )
    return result
