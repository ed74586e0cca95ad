"""Structural similarity (SSIM; Wang, Bovik, Sheikh & Simoncelli, IEEE TIP 13(4), 2004).

The default (``ssim_impl="skimage"``) is scikit-image's ``structural_similarity`` with
``gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1.0``: the setting of
Wang et al. 2004 (an 11x11 circular-symmetric Gaussian window with sigma 1.5, K1=0.01, K2=0.03,
population statistics), averaged over the pixels whose window lies fully inside the image and,
for RGB, over the channels (``channel_axis``). Images must be at least 11x11 pixels.

``ssim_impl="censor_code"`` reproduces the SSIM of CENSOR's code (inversefed's ``ssim_batch``,
inherited from GIAS/GIFD): the same 11x11 Gaussian window and constants, but convolved with zero
padding, so that the mean runs over every pixel and the border windows see zeros. Together with
``space="normalized"`` (the code feeds the ImageNet mean/std-normalized tensors, where the
constants' implied data range of 1 no longer holds) it gives the code's numbers, which are not
standard SSIM values.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from skimage.metrics import structural_similarity
from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues, Stats, to_space

SIGMA = 1.5
WINDOW = 11  # 2 * int(3.5 * 1.5 + 0.5) + 1: skimage's Gaussian truncation gives the same size.
K1, K2 = 0.01, 0.03


def ssim_skimage(recon: Tensor, orig: Tensor, data_range: float = 1.0) -> list[float]:
    """Wang et al. 2004 SSIM per image pair, via scikit-image."""
    h, w = orig.shape[-2:]
    if min(h, w) < WINDOW:
        raise ValueError(
            f"SSIM with an {WINDOW}x{WINDOW} Gaussian window needs images of at "
            f"least {WINDOW}x{WINDOW} pixels; got {h}x{w}."
        )
    a = recon.detach().cpu().double().numpy()
    b = orig.detach().cpu().double().numpy()
    values = []
    for x, y in zip(a, b, strict=True):
        rgb = x.shape[0] > 1
        value = structural_similarity(
            x if rgb else x[0],
            y if rgb else y[0],
            gaussian_weights=True,
            sigma=SIGMA,
            use_sample_covariance=False,
            data_range=data_range,
            channel_axis=0 if rgb else None,
        )
        values.append(float(value))
    return values


def gaussian_window(size: int = WINDOW, sigma: float = SIGMA) -> Tensor:
    """The normalized 2-D Gaussian window, as the outer product of the 1-D one."""
    g = torch.tensor(
        [math.exp(-((i - size // 2) ** 2) / (2 * sigma**2)) for i in range(size)],
        dtype=torch.float64,
    )
    g = g / g.sum()
    return torch.outer(g, g)


def ssim_censor_code(recon: Tensor, orig: Tensor) -> list[float]:
    """SSIM as CENSOR's code computes it: zero-padded Gaussian filtering, mean over C, H, W."""
    x, y = recon.detach().double(), orig.detach().double()
    c = x.shape[1]
    window = gaussian_window().to(x.device).expand(c, 1, WINDOW, WINDOW)

    def filt(t: Tensor) -> Tensor:
        return F.conv2d(t, window, padding=WINDOW // 2, groups=c)

    mu_x, mu_y = filt(x), filt(y)
    var_x = filt(x * x) - mu_x**2
    var_y = filt(y * y) - mu_y**2
    cov = filt(x * y) - mu_x * mu_y
    c1, c2 = K1**2, K2**2  # data range 1, whatever the tensors' actual range
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / (
        (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    )
    return ssim_map.flatten(1).mean(dim=1).tolist()


@METRICS.register("ssim")
class SSIM(ImageMetric):
    name = "ssim"
    label = "SSIM"
    defender_direction = "down"
    best = 1.0

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        x = to_space(recon, settings, mean, std)
        y = to_space(orig, settings, mean, std)
        if settings.ssim_impl == "censor_code":
            values = ssim_censor_code(x, y)
        else:
            # data_range stays 1.0 in normalized space too: that is the constant the code uses.
            values = ssim_skimage(x, y, data_range=1.0)
        if not np.all(np.isfinite(values)):
            raise FloatingPointError(f"SSIM produced non-finite values {values}.")
        return MetricValues(values)
