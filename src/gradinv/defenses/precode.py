"""PRECODE (Scheliga et al., WACV 2022): a variational bottleneck before the output layer.

A fully connected encoder maps the features h to 2K outputs: mu is the first half and sigma the
softplus of the second; z = mu + sigma * eps is decoded by a fully connected layer back to h's
size, and the rest of the model runs on the decoded features. The client's loss gains
beta * KL(N(mu, sigma^2) || N(0, 1)) (../papers/cvb_precode.txt, Eq. 3). Defaults K = 256,
beta = 1e-3, placed just before the classifier, as in the PRECODE code.

Where the code differs from the paper, both are settings: ``kl: code`` divides the KL by ln 2
(bits, ``VariationalBottleneck.loss`` in the PRECODE code), ``kl: paper`` keeps nats. Features of
any shape are flattened into the encoder and the decoder restores the shape, as the code does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.defenses import DEFENSES
from gradinv.defenses.bottleneck import (
    BITS,
    BottleneckDefense,
    VariationalBottleneck,
    gaussian_kl,
    insert_after,
    insert_before,
)
from gradinv.models import classifier_layer, feature_shape
from gradinv.protocol import ModelSpec
from gradinv.settings import bounded


class DenseBottleneck(VariationalBottleneck):
    """PRECODE's module over features of shape ``shape`` (one sample's)."""

    def __init__(self, shape: tuple[int, ...], size: int, beta: float, kl: str) -> None:
        super().__init__(beta)
        features = 1
        for d in shape:
            features *= d
        self.shape, self.size, self.kl = shape, size, kl
        self.encoder = nn.Linear(features, 2 * size)
        self.decoder = nn.Linear(size, features)

    def forward(self, h: Tensor) -> Tensor:
        stats = self.encoder(h.flatten(1))
        mu, sigma = stats[:, : self.size], F.softplus(stats[:, self.size :])
        kl = gaussian_kl(mu, sigma, "std", dims=(1,))
        z = self.sample(mu, sigma, kl / BITS if self.kl == "code" else kl)
        return self.decoder(z).view(len(h), *self.shape)


@DEFENSES.register("precode")
class Precode(BottleneckDefense):
    @dataclass(frozen=True)
    class Settings:
        size: int = bounded(256, ge=1, doc="K, the bottleneck's size")
        beta: float = bounded(1e-3, ge=0.0, doc="weight of the KL term in the client's loss")
        kl: Literal["code", "paper"] = "code"
        position: str = "classifier"  # before the classifier, or after the module so named

    def wrap_model(self, model: nn.Module, spec: ModelSpec) -> nn.Module:
        s = self.settings
        if s.position == "classifier":
            name, fc = classifier_layer(model)
            return insert_before(
                model, name, DenseBottleneck((fc.in_features,), s.size, s.beta, s.kl)
            )
        shape = feature_shape(model, spec, s.position)
        return insert_after(model, s.position, DenseBottleneck(shape, s.size, s.beta, s.kl))
