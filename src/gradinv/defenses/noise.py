"""Additive noise on every gradient entry: Gaussian (Zhu et al. 2019, arXiv:1906.08935) and
Laplace (the noisy-gradient baseline of Refiner and DCS²).

CENSOR's text says Gaussian std 0.1; its code (and GGL's, GIFD's) uses 0.01, and 1e-4 for
StyleGAN2. DCS²'s code sweeps both noises over scales 1e-4 to 1e-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients
from gradinv.settings import bounded


class AdditiveNoise(Defense):
    """g + noise, one independent draw per entry, drawn on the CPU from the client's generator."""

    randomized = True

    def noise(
        self, shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype
    ) -> Tensor:
        raise NotImplementedError

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        return {
            n: g + self.noise(g.shape, generator, g.dtype).to(g.device) for n, g in grads.items()
        }

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        return {
            k: g[None] + self.noise((n, *g.shape), generator, g.dtype).to(g)
            for k, g in grads.items()
        }


@DEFENSES.register("gaussian_noise")
class GaussianNoise(AdditiveNoise):
    @dataclass(frozen=True)
    class Settings:
        std: float = bounded(0.01, ge=0.0, doc="standard deviation of the added noise")

    def noise(
        self, shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype
    ) -> Tensor:
        return self.settings.std * torch.randn(shape, generator=generator, dtype=dtype)


@DEFENSES.register("laplace_noise")
class LaplaceNoise(AdditiveNoise):
    @dataclass(frozen=True)
    class Settings:
        scale: float = bounded(0.01, ge=0.0, doc="b: the noise's density is exp(-|x|/b) / 2b")

    def noise(
        self, shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype
    ) -> Tensor:
        # the difference of two Exp(1) draws is Laplace(0, 1); unlike the inverse CDF of a
        # uniform draw, it is never infinite (torch.rand can return 0 exactly)
        pair = torch.empty((2, *shape), dtype=dtype).exponential_(generator=generator)
        return self.settings.scale * (pair[0] - pair[1])
