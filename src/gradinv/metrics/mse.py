"""Mean squared error per image, on ``[0, 1]``.

The pixel-space distance of every gradient-inversion paper. CENSOR (NDSS 2025, arXiv:2501.15718)
reports it as "MSE↑" on the denormalized, clamped images, so it is computed on ``[0, 1]``
whatever ``MetricSettings.space`` says.
"""

from __future__ import annotations

from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues, Stats


def mse_per_image(recon: Tensor, orig: Tensor) -> Tensor:
    """``mean((recon_i - orig_i)^2)`` over channels and pixels, in float64, shape ``(N,)``."""
    diff = recon.detach().double() - orig.detach().double()
    return diff.pow(2).flatten(1).mean(dim=1)


@METRICS.register("mse")
class MSE(ImageMetric):
    name = "mse"
    label = "MSE"
    defender_direction = "up"
    best = 0.0

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        return MetricValues(mse_per_image(recon, orig).tolist())
