"""No defense: the client shares its true gradient."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients


@DEFENSES.register("none")
class NoDefense(Defense):
    @dataclass(frozen=True)
    class Settings:
        pass

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        return grads
