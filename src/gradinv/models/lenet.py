"""The LeNet of DLG (Zhu et al. 2019, arXiv:1906.08935): sigmoid activations, no pooling.

Sigmoids are twice differentiable everywhere, which is why DLG-style attacks prefer this model;
the stride-2 convolutions keep it small enough for L-BFGS. Weights and biases are drawn from
U(-0.5, 0.5), DLG's initialisation (larger than PyTorch's default, which makes the gradient
informative at round 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gradinv.models import MODELS


@MODELS.register("lenet")
class LeNet:
    @dataclass(frozen=True)
    class Settings:
        pass

    @staticmethod
    def build(num_classes: int, in_channels: int, image_size: int, s: Settings) -> nn.Module:
        side = -(-image_size // 4)  # two stride-2 convolutions, rounding up
        model = nn.Sequential(
            nn.Conv2d(in_channels, 12, 5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=2),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, 5, padding=2, stride=1),
            nn.Sigmoid(),
            nn.Flatten(),
            nn.Linear(12 * side * side, num_classes),
        )
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.uniform_(module.weight, -0.5, 0.5)
                nn.init.uniform_(module.bias, -0.5, 0.5)
        return model
