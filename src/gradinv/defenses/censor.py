"""CENSOR (Zhang et al., NDSS 2025, Section IV and Algorithm 1): share an orthogonal gradient.

The client computes its gradient G0, then for each of T trials draws a random direction for every
layer l, removes its projection onto g_l and rescales it to ‖g_l‖ (or, with ``scope:
whole-model``, does the same once for the whole flattened gradient, Table VII). It scores each
candidate G_t by the loss of θ − η·G_t on its own batch and shares the candidate with the lowest
loss. Random draws come from the CPU generator, trial by trial and layer by layer, so one seed
gives the same update on any device.

The official code (KaiyuanZh/censor, ``defense.py``) differs from the paper's text; each
difference is a setting, with the paper's behaviour as the default:

- ``projection``: ``exact`` removes (r·g/‖g‖²)·g (the paper's Eq. 12), so every candidate is
  orthogonal to g. ``as-coded`` draws r with unit norm and removes (r·g/‖g‖)·g, which is
  orthogonal only when ‖g‖ = 1: on small-norm layers (biases, batch-norm) the candidate keeps a
  component along g of about (r·ĝ)(1 − ‖g‖).
- ``selection_lr``: η of the candidate loss; 0 uses the learning rate of the update the client
  takes (``fl.lr`` under FedSGD, ``fl.local_lr`` under FedAvg), the code fixes 1e-4.
- ``fallback``: when no candidate's loss is below the undefended loss L(θ),
  ``best-candidate`` still shares the best orthogonal candidate; ``as-coded`` shares the original
  gradient, as the code (and the initialisation G* = G0 of Algorithm 1) does. That fallback
  leaks the raw gradient, and a warning says so each time it fires.
- ``scope``: ``layer-wise`` (Algorithm 1) or ``whole-model`` (Table VII).
- ``trials``: T (20 in the paper and the code).

Is the selection meaningful? With the exact projection every candidate is orthogonal to g, so the
first-order term of L(θ − η·G_t) vanishes and the candidates differ only at second order (η²); at
the code's η = 1e-4 in float32 their losses differ from L(θ) by float resolution alone. With the
``as-coded`` projection the lowest loss goes to the candidate with the largest leftover component
along g: the selection picks the direction that leaks most. Every update records how often the
fallback fired and the cosine between the shared update and the true gradient
(:attr:`Censor.stats`), so both effects show in the results.

Candidates are scored one after another (``evaluation: sequential``) or in one batched pass with
``torch.func.vmap`` over stacked parameters (``batched``); ``auto`` batches on a GPU and loops on
the CPU, where the loop measured faster. Both select the same candidate.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients, LossFn, gradients_of
from gradinv.settings import bounded


class CensorFallbackWarning(UserWarning):
    """CENSOR shared the client's original gradient: the update is not protected."""


@DEFENSES.register("censor")
class Censor(Defense):
    @dataclass(frozen=True)
    class Settings:
        trials: int = bounded(20, ge=1, doc="T: candidate orthogonal gradients per update")
        projection: Literal["exact", "as-coded"] = "exact"
        selection_lr: float = bounded(
            0.0, ge=0.0, doc="η of the candidate loss; 0 = the client's update learning rate"
        )
        fallback: Literal["best-candidate", "as-coded"] = "best-candidate"
        scope: Literal["layer-wise", "whole-model"] = "layer-wise"
        evaluation: Literal["auto", "sequential", "batched"] = "auto"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.stats = {"updates": 0, "fallbacks": 0, "cosine_sum": 0.0}
        self.last: dict[str, object] = {}

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        s = self.settings
        eta = s.selection_lr or self.update_lr
        if not eta:
            raise ValueError(
                "CENSOR needs the step size η of its selection: set defenses.<name>.selection_lr "
                "or let the pipeline pass the FL learning rate"
            )
        original = {n: g.detach() for n, g in gradients_of(model, inputs, labels, loss_fn).items()}
        candidates = [self._candidate(original, generator) for _ in range(s.trials)]
        was_training = model.training
        model.eval()  # the code scores candidates in eval mode
        try:
            base_loss, losses = self._losses(model, inputs, labels, loss_fn, candidates, eta)
        finally:
            model.train(was_training)
        best = int(torch.argmin(losses))
        fired = not bool(losses[best] < base_loss)
        shared = candidates[best]
        if fired and s.fallback == "as-coded":
            warnings.warn(
                "CENSOR fallback (as-coded): no candidate lowered the loss, so the client shares "
                "its original gradient, unprotected",
                CensorFallbackWarning,
                stacklevel=2,
            )
            shared = original
        cosine = gradient_cosine(shared, original)
        self.stats["updates"] += 1
        self.stats["fallbacks"] += int(fired)
        self.stats["cosine_sum"] += cosine
        self.last = {
            "losses": losses.tolist(),
            "base_loss": float(base_loss),
            "selected": best,
            "fallback_fired": fired,
            "cosine": cosine,
        }
        return shared

    def _candidate(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        """One orthogonal, norm-matched gradient (Algorithm 1, ORTHOGONAL_GRAD + NORMALIZE_GRAD)."""
        if self.settings.scope == "layer-wise":
            return {n: self._orthogonal(g, generator) for n, g in grads.items()}
        names = list(grads)
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        out = self._orthogonal(flat, generator)
        pieces = out.split([grads[n].numel() for n in names])
        return {n: p.view_as(grads[n]) for n, p in zip(names, pieces, strict=True)}

    def _orthogonal(self, g: Tensor, generator: torch.Generator) -> Tensor:
        r = torch.randn(g.shape, generator=generator, dtype=g.dtype).to(g.device)
        return orthogonal_direction(g, r, self.settings.projection)

    def _losses(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        candidates: list[Gradients],
        eta: float,
    ) -> tuple[Tensor, Tensor]:
        params = {n: p.detach() for n, p in model.named_parameters()}
        buffers = {n: b for n, b in model.named_buffers()}
        with torch.no_grad():
            base = loss_fn(model(inputs), labels)
            if self._batched(inputs):
                stacked = {
                    n: torch.stack([p - eta * c[n] if n in c else p for c in candidates])
                    for n, p in params.items()
                }

                def loss_of(p: dict[str, Tensor]) -> Tensor:
                    return loss_fn(functional_call(model, {**p, **buffers}, (inputs,)), labels)

                return base, vmap(loss_of)(stacked)
            losses = []
            for c in candidates:
                moved = {n: p - eta * c[n] if n in c else p for n, p in params.items()}
                out = functional_call(model, {**moved, **buffers}, (inputs,))
                losses.append(loss_fn(out, labels))
            return base, torch.stack(losses)

    def _batched(self, inputs: Tensor) -> bool:
        mode = self.settings.evaluation
        return mode == "batched" or (mode == "auto" and inputs.is_cuda)

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        raise TypeError("CENSOR needs the model and the batch; call shared_update")


def gradient_cosine(a: Gradients, b: Gradients) -> float:
    """Cosine between two gradients over all of ``b``'s layers, flattened together."""
    dot = sum((a[n] * b[n]).sum() for n in b)
    na = torch.sqrt(sum(a[n].pow(2).sum() for n in b))
    nb = torch.sqrt(sum(b[n].pow(2).sum() for n in b))
    return float(dot / (na * nb)) if na > 0 and nb > 0 else 0.0


def orthogonal_direction(g: Tensor, r: Tensor, projection: str = "exact") -> Tensor:
    """``r`` with its component along ``g`` removed, rescaled to ‖g‖ (differentiable in both).

    ``exact`` removes (r·g/‖g‖²)·g (Eq. 12); ``as-coded`` normalizes r to unit norm and removes
    (r·g/‖g‖)·g, as the official code does (orthogonal only when ‖g‖ = 1). A zero ``g`` gives
    zeros. The EOT attack uses it on its dummy gradient, CENSOR on the client's gradient.
    """
    norm = g.norm()
    if norm == 0:
        return torch.zeros_like(g)
    if projection == "exact":
        o = r - (r * g).sum() / norm**2 * g
    else:  # the code: unit-norm r, then r - (r·g/‖g‖)·g
        r = r / r.norm()
        o = r - (r * g).sum() / norm * g
    return o * (norm / o.norm())
