"""The 3-layer CNN of the CVB paper (Scheliga et al.; ../papers/cvb_precode.txt, Section V).

Three 5x5 stride-2 convolutions of 16, 32 and 64 channels with ReLU, then a linear classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gradinv.models import MODELS
from gradinv.settings import bounded


@MODELS.register("cnn3")
class CNN3:
    @dataclass(frozen=True)
    class Settings:
        channels: tuple[int, ...] = bounded(
            (16, 32, 64), ge=1, min_items=1, doc="output channels of each convolution"
        )
        kernel_size: int = bounded(5, ge=1)

    @staticmethod
    def build(num_classes: int, in_channels: int, image_size: int, s: Settings) -> nn.Module:
        layers: list[nn.Module] = []
        side, cin = image_size, in_channels
        for cout in s.channels:
            layers += [
                nn.Conv2d(cin, cout, s.kernel_size, stride=2, padding=s.kernel_size // 2),
                nn.ReLU(),
            ]
            side, cin = -(-side // 2), cout
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(cin * side * side, num_classes))
