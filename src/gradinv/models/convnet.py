"""The ConvNet of Soteria and DCS² (inversefed's ``ConvNet``, Geiping et al. 2020).

Eight 3x3 convolutions with batch norm and ReLU in four stages of width w, 2w, 4w, 4w, with max
pooling after the second, fifth and eighth, then one linear layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gradinv.models import MODELS
from gradinv.settings import bounded


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


@MODELS.register("convnet")
class ConvNet:
    @dataclass(frozen=True)
    class Settings:
        width: int = bounded(64, ge=1)

    @staticmethod
    def build(num_classes: int, in_channels: int, image_size: int, s: Settings) -> nn.Module:
        w = s.width
        layers = [
            *_conv(in_channels, w),
            *_conv(w, 2 * w),
            *_conv(2 * w, 2 * w),
            *_conv(2 * w, 4 * w),
            *_conv(4 * w, 4 * w),
            *_conv(4 * w, 4 * w),
            nn.MaxPool2d(3),
            *_conv(4 * w, 4 * w),
            *_conv(4 * w, 4 * w),
            *_conv(4 * w, 4 * w),
            nn.MaxPool2d(3),
        ]
        side = image_size // 3 // 3
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(4 * w * side * side, num_classes))
