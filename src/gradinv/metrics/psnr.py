"""Peak signal-to-noise ratio per image, on ``[0, 1]``: ``10 log10(1 / MSE)``.

Computed per image and then averaged (inversefed's ``psnr(batched=False)``, which CENSOR's code
calls with ``factor=1`` on the denormalized, clamped images), never from the batch MSE.

An exact reconstruction has MSE 0 and PSNR ``+inf``. The value is kept as ``float("inf")``, not
capped: a cap would be a number nobody measured, and the batch mean then is ``+inf`` too, which
says plainly that an image was recovered exactly (``gradinv.io.write_json`` writes it as
``Infinity``). Tables that average runs must decide how to show it.
"""

from __future__ import annotations

import math

from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues, Stats
from gradinv.metrics.mse import mse_per_image


def psnr_from_mse(mse: float) -> float:
    """``10 log10(1 / mse)`` for a peak of 1; ``+inf`` when ``mse == 0``."""
    if mse < 0 or math.isnan(mse):
        raise ValueError(f"MSE must be a non-negative number, got {mse}.")
    return math.inf if mse == 0 else -10.0 * math.log10(mse)


@METRICS.register("psnr")
class PSNR(ImageMetric):
    name = "psnr"
    label = "PSNR"
    defender_direction = "down"
    best = math.inf

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        return MetricValues([psnr_from_mse(m) for m in mse_per_image(recon, orig).tolist()])
