"""Gradient sparsification (Lin et al. 2018; Zhu et al. 2019's pruning defense).

Two conventions, both per parameter tensor:
``top_k`` keeps exactly round((1 - prune) * n) entries of largest magnitude (ties broken by index);
``percentile`` is the GGL/GIFD/CENSOR code: entries whose magnitude lies strictly below the
``100 * prune``-th percentile of |g| (linear interpolation, numpy's default) are zeroed, which keeps
roughly, not exactly, that fraction. The code's "compression 20" is ``prune: 0.2``.
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


def top_k_mask(g: Tensor, prune: float) -> Tensor:
    flat = g.abs().flatten()
    keep = round((1.0 - prune) * flat.numel())
    mask = torch.zeros_like(flat, dtype=torch.bool)
    if keep > 0:
        # A stable sort makes ties deterministic: earlier indices win.
        order = torch.sort(flat, descending=True, stable=True).indices
        mask[order[:keep]] = True
    return mask.view_as(g)


def percentile_mask(g: Tensor, prune: float) -> Tensor:
    magnitude = g.abs()
    threshold = torch.quantile(magnitude.flatten().double(), prune).to(g.dtype)
    return magnitude >= threshold


@DEFENSES.register("sparsification")
class Sparsification(Defense):
    @dataclass(frozen=True)
    class Settings:
        prune: float = bounded(0.2, ge=0.0, le=1.0, doc="fraction of each tensor set to zero")
        rule: Literal["top_k", "percentile"] = "top_k"

    def transform(self, grads: Gradients, generator: torch.Generator | None) -> Gradients:
        mask = top_k_mask if self.settings.rule == "top_k" else percentile_mask
        return {n: g * mask(g, self.settings.prune) for n, g in grads.items()}

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients]:
        """``configured``: the defense's own mask, computed on the dummy gradient; ``estimated``:
        the victim's mask, read from the observed zeros (the GGL and GIFD code's choice)."""
        if mode == "configured":
            return lambda grads: self.transform(grads, None)
        masks = {n: g != 0 for n, g in observed.items()}
        return lambda grads: {n: g * masks[n] for n, g in grads.items()}
