"""Gradient quantization (GQ): each tensor to 2^b levels, b from 1 to 32 (Refiner's sweep).

Each parameter tensor is mapped onto 2^b evenly spaced levels between its own minimum and
maximum, so min and max are kept and the tensor takes at most 2^b distinct values.
``rounding: nearest`` rounds to the closest level (deterministic); ``stochastic`` rounds up with
probability equal to the distance from the level below, which is unbiased (QSGD, Alistarh et al.
2017; FedPAQ, Reisizadeh et al. 2019, cited by Refiner for GQ). The arithmetic runs in float64,
so 32 bits leave a float32 gradient unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients
from gradinv.settings import bounded


def quantize(g: Tensor, bits: int, noise: Tensor | None = None) -> Tensor:
    """``g`` on 2^bits levels between its min and max; ``noise`` ~ U[0, 1) (g's shape) rounds
    stochastically, None rounds to the nearest level."""
    x = g.double()
    low, high = x.min(), x.max()
    if high == low:
        return g.clone()
    step = (high - low) / (2.0**bits - 1)
    position = (x - low) / step
    index = torch.floor(position + noise.double()) if noise is not None else torch.round(position)
    return (low + index * step).to(g.dtype)


@DEFENSES.register("quantization")
class Quantization(Defense):
    @dataclass(frozen=True)
    class Settings:
        bits: int = bounded(8, ge=1, le=32, doc="b: each tensor takes at most 2^b values")
        rounding: Literal["nearest", "stochastic"] = "nearest"

    @property
    def randomized(self) -> bool:  # type: ignore[override]
        return self.settings.rounding == "stochastic"

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        bits = self.settings.bits
        if self.settings.rounding == "nearest":
            return {n: quantize(g, bits) for n, g in grads.items()}
        return {
            n: quantize(g, bits, torch.rand(g.shape, generator=generator).to(g.device))
            for n, g in grads.items()
        }

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients] | None:
        """Nearest rounding, differentiable by the straight-through estimator (the forward
        quantizes, the backward passes the gradient through as if it did not): the dummy
        gradient is quantized as the victim's was. Both modes apply the configured bits (the
        observed update also reveals them, as the number of its distinct values)."""
        if self.settings.rounding == "stochastic":
            return None
        bits = self.settings.bits
        return lambda grads: {n: g + (quantize(g, bits) - g).detach() for n, g in grads.items()}

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        """n stochastic roundings of the dummy gradient, straight-through differentiable."""
        if self.settings.rounding == "nearest":
            raise NotImplementedError("nearest rounding is deterministic: nothing to sample")
        bits, out = self.settings.bits, {}
        for k, g in grads.items():
            draws = torch.stack(
                [
                    quantize(g, bits, torch.rand(g.shape, generator=generator).to(g.device))
                    for _ in range(n)
                ]
            )
            out[k] = g[None] + (draws - g[None]).detach()
        return out
