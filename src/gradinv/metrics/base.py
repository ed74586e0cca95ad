"""The image-metric interface, its settings, and the input checks every metric shares.

A metric compares reconstructions with the private originals it tries to recover, image by image.
Inputs are float tensors ``(N, C, H, W)`` in ``[0, 1]`` with ``C`` in ``{1, 3}``; the caller
denormalizes and clamps first, as CENSOR's code does (``clamp(x * std + mean, 0, 1)``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from gradinv.settings import ConfigError, bounded

Direction = Literal["up", "down"]
Stats = Sequence[float] | Tensor

# Reconstructions denormalized in float32 can land a rounding error outside [0, 1]; anything
# further out means the caller forgot to clamp, and the metric would score an image that is not one.
RANGE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class MetricSettings:
    """How the image metrics are computed (``params.yaml``: the ``metrics`` block).

    Build it with ``gradinv.settings.from_mapping(MetricSettings, cfg, "metrics")``: an unknown key
    or a value outside a field's choices is a :class:`~gradinv.settings.ConfigError`.

    ``space`` and ``ssim_impl`` exist because CENSOR's *code* differs from the standard metrics:
    it computes SSIM and LPIPS on the ImageNet mean/std-normalized tensors (not on ``[0, 1]`` or
    ``[-1, 1]``), and its SSIM is inversefed's zero-padded Gaussian SSIM rather than Wang et al.'s
    valid-window mean. ``space="normalized", ssim_impl="censor_code"`` reproduces the code's values;
    the defaults are the standard metrics. MSE and PSNR are on ``[0, 1]`` in both spaces, as in
    the code.
    """

    lpips_net: Literal["vgg", "alex"] = bounded(
        "vgg", doc="LPIPS backbone; CENSOR's tables report VGG (its code also computes AlexNet)"
    )
    lpips_weights_path: str = bounded(
        "", doc="torchvision ImageNet weights of the LPIPS backbone; empty: the torch hub cache"
    )
    space: Literal["unit", "normalized"] = bounded(
        "unit", doc="SSIM/LPIPS input: [0,1] (standard) or (x-mean)/std as in CENSOR's code"
    )
    ssim_impl: Literal["skimage", "censor_code"] = bounded(
        "skimage", doc="skimage (Wang et al. 2004) or CENSOR/inversefed's zero-padded SSIM"
    )
    evaluation_network: str = bounded(
        "",
        doc="noise_ratio: Refiner's evaluation network file; empty: the one the pipeline trains "
        "for the dataset (data/evalnet/<dataset>.pt)",
    )
    match: bool = bounded(True, doc="Hungarian-match reconstructions to originals when N > 1")
    success_ssim: float = bounded(
        0.6,
        ge=0.0,
        le=1.0,
        doc="attack_success (the CVB paper's ASR): an image counts as reconstructed at this SSIM "
        "or above; the paper's text lost the value, 0.6 fits its tables (SSIM 0.64 -> ASR 85%)",
    )
    match_cost: Literal["mse", "ssim", "lpips"] = bounded(
        "mse", doc="pairwise metric that the Hungarian matching minimizes"
    )

    def __post_init__(self) -> None:
        # from_mapping checks numeric bounds only; a Literal typo would otherwise pass silently.
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            tp = hints[f.name]
            value = getattr(self, f.name)
            if typing.get_origin(tp) is Literal and value not in typing.get_args(tp):
                choices = ", ".join(map(repr, typing.get_args(tp)))
                raise ConfigError(f"metrics.{f.name}: {value!r} is not one of {choices}.")
            if tp is bool and not isinstance(value, bool):
                raise ConfigError(f"metrics.{f.name}: {value!r} must be true or false.")
            if tp is str and not isinstance(value, str):
                raise ConfigError(f"metrics.{f.name}: {value!r} must be a string.")


@dataclass(frozen=True)
class MetricValues:
    """Per-image values of one metric, or ``None`` with the reason when it cannot be computed."""

    per_image: list[float] | None
    status: str = "ok"


class ImageMetric:
    """Base class of a registered image metric.

    ``defender_direction`` is the arrow of CENSOR's tables: ``"up"`` when a higher value means
    better privacy (the reconstruction is further from the original: MSE, LPIPS), ``"down"`` when
    a lower value does (PSNR, SSIM). ``best`` is the value of a perfect reconstruction.
    A metric that can be unavailable (it needs files that may be missing) sets ``reports_status``,
    and :func:`~gradinv.metrics.score` then records its status under ``<name>_status``.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    defender_direction: ClassVar[Direction]
    best: ClassVar[float]
    reports_status: ClassVar[bool] = False

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        """One value per image pair ``(recon[i], orig[i])``; inputs pass :func:`check_images`."""
        raise NotImplementedError

    def pairwise(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        """Values for every pair of M reconstructions and N originals, flattened row-major:
        entry ``i * N + j`` is (recon i, orig j)."""
        rows = recon.repeat_interleave(orig.shape[0], dim=0)
        cols = orig.repeat(recon.shape[0], 1, 1, 1)
        return self.per_image(rows, cols, settings, mean, std)


def check_images(recon: Tensor, orig: Tensor, same_count: bool = True) -> None:
    """Raise ``ValueError`` unless both are finite float ``(N, C, H, W)`` batches in ``[0, 1]``
    of the same shape (with ``same_count=False``, the reconstructions may be more: an attack
    that recovers a batch with added samples, DCS²'s concealed ones, is scored on the matched
    subset)."""
    for name, x in (("reconstructions", recon), ("originals", orig)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}.")
        if x.ndim != 4 or x.shape[1] not in (1, 3):
            raise ValueError(
                f"{name} must have shape (N, C, H, W) with C in {{1, 3}}; got {tuple(x.shape)}."
            )
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a float tensor in [0, 1]; got {x.dtype}.")
        if x.shape[0] == 0:
            raise ValueError(f"{name} is an empty batch.")
        if not torch.isfinite(x).all():
            # Failures are loud: a NaN reconstruction is a failed attack run, not a bad score.
            raise ValueError(f"{name} contain NaN or inf values.")
        lo, hi = x.min().item(), x.max().item()
        if lo < -RANGE_TOLERANCE or hi > 1 + RANGE_TOLERANCE:
            raise ValueError(
                f"{name} span [{lo:.4g}, {hi:.4g}], outside [0, 1]: denormalize "
                "and clamp them first (x * std + mean).clamp(0, 1)."
            )
    if recon.shape[1:] != orig.shape[1:] or (
        recon.shape[0] != orig.shape[0] if same_count else recon.shape[0] < orig.shape[0]
    ):
        raise ValueError(
            f"reconstructions {tuple(recon.shape)} and originals "
            f"{tuple(orig.shape)} differ in shape."
        )


def to_space(x: Tensor, settings: MetricSettings, mean: Stats | None, std: Stats | None) -> Tensor:
    """``x`` in the space SSIM and LPIPS are computed in: ``[0, 1]`` or ``(x - mean) / std``."""
    if settings.space == "unit":
        return x
    if mean is None or std is None:
        raise ValueError(
            "metrics.space='normalized' needs the dataset's mean and std; "
            "pass mean= and std= to score()."
        )
    c = x.shape[1]
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).flatten()
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).flatten()
    if m.numel() != c or s.numel() != c:
        raise ValueError(
            f"mean {m.tolist()} and std {s.tolist()} must have one entry per channel ({c})."
        )
    if (s <= 0).any():
        raise ValueError(f"std {s.tolist()} must be positive.")
    return (x - m.view(1, c, 1, 1)) / s.view(1, c, 1, 1)
