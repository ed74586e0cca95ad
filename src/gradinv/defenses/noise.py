"""Additive Gaussian noise on every gradient entry (Zhu et al. 2019, arXiv:1906.08935).

CENSOR's text says std 0.1; its code (and GGL's, GIFD's) uses 0.01, and 1e-4 for StyleGAN2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients
from gradinv.settings import bounded


@DEFENSES.register("gaussian_noise")
class GaussianNoise(Defense):
    randomized = True

    @dataclass(frozen=True)
    class Settings:
        std: float = bounded(0.01, ge=0.0, doc="standard deviation of the added noise")

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        std = self.settings.std
        return {
            n: g + std * torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device)
            for n, g in grads.items()
        }

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        std = self.settings.std
        return {
            k: g[None] + std * torch.randn((n, *g.shape), generator=generator, dtype=g.dtype).to(g)
            for k, g in grads.items()
        }
