"""Gradient clipping (Abadi et al. 2016 without noise; Geiping et al. 2020's baseline).

``global`` rescales the whole update so its L2 norm is at most the bound (the GGL/GIFD/CENSOR
code, bound 4); ``per_layer`` applies the bound to each parameter tensor separately.
"""

from __future__ import annotations

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


def clip_per_layer(grads: Gradients, bound: float) -> Gradients:
    return {n: g * torch.clamp(bound / (g.norm() + 1e-12), max=1.0) for n, g in grads.items()}


@DEFENSES.register("clipping")
class Clipping(Defense):
    @dataclass(frozen=True)
    class Settings:
        bound: float = bounded(4.0, gt=0.0, doc="maximum L2 norm")
        scope: Literal["global", "per_layer"] = "global"

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        clip = clip_global if self.settings.scope == "global" else clip_per_layer
        return clip(grads, self.settings.bound)
