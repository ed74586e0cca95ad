"""Image-similarity and privacy metrics, registered by name; see README.md to add one.

``score`` is the pipeline's entry point: it Hungarian-matches a batch of reconstructions to the
private originals and returns a flat dict of per-batch means and per-image values (MSE, PSNR,
SSIM, LPIPS, Refiner's noise ratio) plus the label accuracy. The originals are the client's
secret: only this scoring step, after the attack, ever sees them.
"""

from __future__ import annotations

from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues
from gradinv.registry import Registry

METRICS: Registry[type[ImageMetric]] = Registry("metric")

from gradinv.metrics import (  # noqa: E402, F401  (fill METRICS)
    lpips,
    mse,
    noise_ratio,
    psnr,
    ssim,
)
from gradinv.metrics.labels import label_accuracy  # noqa: E402
from gradinv.metrics.matching import match_reconstructions  # noqa: E402
from gradinv.metrics.score import score  # noqa: E402

__all__ = [
    "METRICS",
    "ImageMetric",
    "MetricSettings",
    "MetricValues",
    "label_accuracy",
    "match_reconstructions",
    "score",
]
