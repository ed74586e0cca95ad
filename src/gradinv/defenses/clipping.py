"""Gradient clipping (Abadi et al. 2016 without noise; Geiping et al. 2020's baseline).

``global`` rescales the whole update so its L2 norm is at most the bound (the GGL/GIFD/CENSOR
code, bound 4); ``per_layer`` applies the bound to each parameter tensor separately.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients
from gradinv.settings import bounded


def clip_global(grads: Gradients, bound: float) -> Gradients:
    total = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
    scale = torch.clamp(bound / (total + 1e-12), max=1.0)
    return {n: g * scale for n, g in grads.items()}


def clip_per_layer(grads: Gradients, bound: float | dict[str, float]) -> Gradients:
    """Each tensor to at most ``bound``, or to its own bound ``bound[name]``."""
    bounds = bound if isinstance(bound, dict) else dict.fromkeys(grads, bound)
    return {n: g * torch.clamp(bounds[n] / (g.norm() + 1e-12), max=1.0) for n, g in grads.items()}


@DEFENSES.register("clipping")
class Clipping(Defense):
    @dataclass(frozen=True)
    class Settings:
        bound: float = bounded(4.0, gt=0.0, doc="maximum L2 norm")
        scope: Literal["global", "per_layer"] = "global"

    def transform(self, grads: Gradients, generator: torch.Generator | None) -> Gradients:
        clip = clip_global if self.settings.scope == "global" else clip_per_layer
        return clip(grads, self.settings.bound)

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients]:
        """``estimated``: the bound is the observed norm (global, or each layer's), which equals
        the configured bound wherever the clip was active, and is harmless where it was not."""
        if mode == "configured":
            return lambda grads: self.transform(grads, None)
        if self.settings.scope == "global":
            bound = float(torch.sqrt(sum(g.pow(2).sum() for g in observed.values())))
            return lambda grads: clip_global(grads, bound)
        bounds = {n: float(g.norm()) for n, g in observed.items()}
        return lambda grads: clip_per_layer(grads, bounds)
