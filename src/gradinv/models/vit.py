"""A small Vision Transformer (Dosovitskiy et al. 2021, arXiv:2010.11929), torchvision's
implementation, for the ViT experiments of the CVB and Refiner papers.

The CVB paper's ViT is small (a few transformer blocks, GELU) with a square hidden size, so that
its CVB can see the tokens as square feature maps; the numbers of its text were lost in our copy
of the paper, so the defaults here (patch 4, 6 blocks, hidden size 64, 8 heads, MLP 128) are our
choice, each a setting. No dropout: the shared gradient is then a deterministic function of the
batch, as for the other models.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gradinv.models import MODELS
from gradinv.settings import bounded


@MODELS.register("vit")
class ViT:
    @dataclass(frozen=True)
    class Settings:
        patch_size: int = bounded(4, ge=1)
        num_layers: int = bounded(6, ge=1, doc="transformer blocks")
        num_heads: int = bounded(8, ge=1)
        hidden_dim: int = bounded(64, ge=1, doc="a square, for a CVB after a block")
        mlp_dim: int = bounded(128, ge=1)

    @staticmethod
    def build(num_classes: int, in_channels: int, image_size: int, s: Settings) -> nn.Module:
        if image_size % s.patch_size:
            raise ValueError(
                f"the ViT's patch size {s.patch_size} does not divide the image size "
                f"{image_size}; choose models.<name>.patch_size among its divisors"
            )
        if s.hidden_dim % s.num_heads:
            raise ValueError(
                f"the ViT's hidden size {s.hidden_dim} is not a multiple of its {s.num_heads} "
                "heads; change models.<name>.hidden_dim or num_heads"
            )
        import torchvision  # on use: importing it costs seconds per job

        model = _math_attention_vit(torchvision)(
            image_size=image_size,
            patch_size=s.patch_size,
            num_layers=s.num_layers,
            num_heads=s.num_heads,
            hidden_dim=s.hidden_dim,
            mlp_dim=s.mlp_dim,
            num_classes=num_classes,
        )
        if in_channels != 3:
            model.conv_proj = nn.Conv2d(
                in_channels, s.hidden_dim, kernel_size=s.patch_size, stride=s.patch_size
            )
        return model


def _math_attention_vit(torchvision):
    """torchvision's ViT with its attention computed by the plain math kernel: the fused CPU
    kernel has no second derivative, and a gradient-matching attack differentiates the model's
    gradient (the parameter names, hence checkpoints, are torchvision's)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class VisionTransformer(torchvision.models.VisionTransformer):
        def forward(self, x):
            with sdpa_kernel(SDPBackend.MATH):
                return super().forward(x)

    return VisionTransformer
