"""CVB, the convolutional variational bottleneck (Scheliga et al.; ../papers/cvb_precode.txt,
Section IV).

Two convolutions of kernel k with "same" zero padding and no bias map the features h (C
channels) to a mean map and a standard-deviation map of K channels, z = mu + sigma * eps is
decoded by a 1x1 convolution back to C channels, so the CVB keeps h's shape and fits after any
layer. The client's loss gains beta * KL. As in the CVB code, sigma = softplus(clip(s, -5, 5))
and K = scale * C, at least 8 (the code's "adaptive" K is scale 0.5).

Placements (``position: auto``): after the first convolution block of a sequential CNN (the
3-layer CNN of Section V: k 5, beta 0.1 in the code), after ``layer1`` of ResNet-18 (the
code's ``VBResNet18GN``: ResNet-18 with ``norm: group``; beta 5e-5), and after the first
transformer block of a ViT, whose tokens (B, N, D) are reshaped to N channels of sqrt(D) x
sqrt(D) maps (so D must be a square). Any module name is accepted instead of ``auto``.

The code's KL differs from the paper's: ``kl: code`` reads sigma as a log-variance,
-1/2 sum_channels (1 + sigma - mu^2 - e^sigma), averaged over the batch and the positions, as
coded; ``kl: paper`` is the KL of N(mu, sigma^2) (Eq. 3) summed over channels and positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.defenses import DEFENSES
from gradinv.defenses.bottleneck import (
    BottleneckDefense,
    VariationalBottleneck,
    gaussian_kl,
    insert_after,
)
from gradinv.models import feature_shape
from gradinv.protocol import ModelSpec
from gradinv.settings import bounded


class ConvBottleneck(VariationalBottleneck):
    """The CVB over feature maps (C, H, W), or over transformer tokens (N, D) seen as N maps of
    sqrt(D) x sqrt(D)."""

    def __init__(
        self, shape: tuple[int, ...], channels: int, kernel_size: int, beta: float, kl: str
    ) -> None:
        super().__init__(beta)
        if len(shape) == 2:
            side = math.isqrt(shape[1])
            if side * side != shape[1]:
                raise ValueError(
                    f"a CVB after a transformer block sees its {shape[0]} tokens as channels of "
                    f"sqrt(D) x sqrt(D) maps, but the hidden size D = {shape[1]} is not a square;"
                    " choose a square hidden size (models.vit.hidden_dim, e.g. 64 or 144)"
                )
        elif len(shape) != 3:
            raise ValueError(f"a CVB needs feature maps (C, H, W) or tokens (N, D); got {shape}")
        self.kl = kl
        c = shape[0]
        self.mu = nn.Conv2d(c, channels, kernel_size, padding="same", bias=False)
        self.sigma = nn.Conv2d(c, channels, kernel_size, padding="same", bias=False)
        self.decoder = nn.Conv2d(channels, c, 1, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        tokens = h.ndim == 3
        if tokens:
            side = math.isqrt(h.shape[-1])
            h = h.reshape(*h.shape[:2], side, side)
        mu = self.mu(h)
        sigma = F.softplus(torch.clamp(self.sigma(h), -5.0, 5.0))
        if self.kl == "code":
            kl = gaussian_kl(mu, sigma, "log_variance", dims=(1,))
        else:
            kl = gaussian_kl(mu, sigma, "std", dims=(1, 2, 3))
        out = self.decoder(self.sample(mu, sigma, kl))
        return out.flatten(2) if tokens else out


def auto_position(model: nn.Module) -> str:
    """Where the CVB paper places the CVB in each architecture (see the module doc)."""
    if hasattr(model, "layer1"):  # ResNet
        return "layer1"
    encoder = getattr(model, "encoder", None)
    if encoder is not None and hasattr(encoder, "layers"):  # torchvision's ViT
        return f"encoder.layers.{next(iter(encoder.layers.named_children()))[0]}"
    if isinstance(model, nn.Sequential):  # a CNN: after the first convolution and its activation
        children = list(model.named_children())
        for i, (name, m) in enumerate(children):
            if isinstance(m, nn.Conv2d):
                after = children[i + 1] if i + 1 < len(children) else None
                if after is not None and next(after[1].parameters(), None) is None:
                    return after[0]
                return name
    raise ValueError(
        f"no automatic CVB position for {type(model).__name__}; set the defense's position to "
        "the name of the module to follow"
    )


@DEFENSES.register("cvb")
class CVB(BottleneckDefense):
    @dataclass(frozen=True)
    class Settings:
        position: str = "auto"  # auto (see the module doc) or a module name to follow
        kernel_size: int = bounded(5, ge=1, doc="k, the encoder kernels' size")
        scale: float = bounded(0.5, gt=0.0, doc="K / C: the bottleneck's channels per input one")
        beta: float = bounded(0.1, ge=0.0, doc="weight of the KL term in the client's loss")
        kl: Literal["code", "paper"] = "code"

    def wrap_model(self, model: nn.Module, spec: ModelSpec) -> nn.Module:
        s = self.settings
        position = auto_position(model) if s.position == "auto" else s.position
        shape = feature_shape(model, spec, position)
        channels = max(8, round(s.scale * shape[0]))
        return insert_after(
            model, position, ConvBottleneck(shape, channels, s.kernel_size, s.beta, s.kl)
        )
