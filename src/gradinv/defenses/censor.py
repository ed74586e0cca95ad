"""CENSOR (Zhang et al., NDSS 2025, Section IV and Algorithm 1): share an orthogonal gradient.

The client computes its gradient G0, then for each of T trials draws a random direction for every
layer l, removes its projection onto g_l and rescales it to ‖g_l‖ (or, with ``scope:
whole-model``, does the same once for the whole flattened gradient, Table VII). It scores each
candidate G_t by the loss of θ − η·G_t on its own batch and shares the candidate with the lowest
loss. Random draws come from the CPU generator, trial by trial and layer by layer, so one seed
gives the same update on any device (``draws: cpu``). On a GPU that costs the most time of the
update (T × the model's size of normal numbers made on the CPU and copied over): ``draws:
device`` makes them on the gradients' device instead, from a generator seeded by the CPU one, so
a seed still fixes the update on a given device, but a GPU run no longer matches a CPU run.

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

``source`` says where the random directions come from. ``gaussian`` (Algorithm 1, the default)
draws r ~ N(0, I). ``public`` follows Section V-E ("Effect of Sampling from a Public Dataset",
Fig. 10): the directions are gradients of public images of one class (``public_class``), and a
GAN-based attack then reconstructs images of that class. The paper does not say how the vectors
are built from the images. Here each trial draws one image of the public pool uniformly (from the
same CPU generator), takes the gradient of the loss on that image alone, with its label, at the
current parameters and in the model's current mode (batch-norm buffers left untouched), and uses
it as r in place of the Gaussian draw: per layer, or flattened for ``scope: whole-model``. The
projection and the rescaling to ‖g‖ are unchanged, so the shared update is still orthogonal to
g, but it points along a public image's gradient. Trials that draw the same image give the same
candidate, so the selection sees at most ``public_images`` distinct candidates, and with T ≥ N it
nearly always shares the direction of the same (lowest-loss) pool image.

The pool (``public_images`` images and their labels, normalized as model inputs) reaches the
defense through ``build_defense(..., public=(images, labels))``; the stages pass the last
``public_images`` validation images of ``public_class``
(:func:`gradinv.data.prepared.public_pool`). The per-image gradients are computed with
``torch.func.vmap``, once per update and only for the images drawn. On the CPU (3-layer CNN,
32x32, batch 1, T = 20, a pool of 16, one thread; medians) an update took 33 ms so, 42 ms with a
loop over the images, and 31 ms with the Gaussian source.

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
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import (
    Defense,
    Gradients,
    LossFn,
    gradient_cosine,
    gradients_of,
    per_sample_gradients,
)
from gradinv.settings import bounded


class CensorFallbackWarning(UserWarning):
    """CENSOR shared the client's original gradient: the update is not protected."""


@DEFENSES.register("censor")
class Censor(Defense):
    randomized = True

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
        draws: Literal["cpu", "device"] = "cpu"
        source: Literal["gaussian", "public"] = "gaussian"
        public_class: int = bounded(0, ge=0, doc="source public: the class of the public images")
        public_images: int = bounded(
            16, ge=1, doc="source public: the pool, the last N validation images of public_class"
        )

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.stats = {"updates": 0, "fallbacks": 0, "cosine_sum": 0.0}

    def state_dict(self) -> dict[str, Any]:
        """The counters behind the training summary's ``defense_stats``: a resumed run goes on
        counting from where it stopped."""
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.update(state.get("stats", {}))  # progress saved before it kept them: none

    @classmethod
    def uses_public(cls, settings: Settings) -> bool:
        return settings.source == "public"

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
        picks: list[int] = []  # source public: the pool image of each trial
        if s.source == "public":
            candidates, picks = self._public_candidates(model, original, loss_fn, generator)
        else:
            draw = _draw_generator(generator, next(iter(original.values())).device, s.draws)
            candidates = [self._candidate(original, draw) for _ in range(s.trials)]
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
        if s.source == "public":
            self.last["public_image"] = picks[best]  # index into the pool of the shared direction
        return shared

    def _candidate(
        self, grads: Gradients, generator: torch.Generator, r: Gradients | None = None
    ) -> Gradients:
        """One orthogonal, norm-matched gradient (Algorithm 1, ORTHOGONAL_GRAD + NORMALIZE_GRAD).

        ``r`` is the random direction of every layer; None draws a Gaussian one, layer by layer
        (or once for the whole flattened gradient).
        """
        projection = self.settings.projection
        if self.settings.scope == "layer-wise":
            out = {}
            for n, g in grads.items():
                direction = _gaussian(g, generator) if r is None else r[n]
                out[n] = orthogonal_direction(g, direction, projection)
            return out
        names = list(grads)
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        if r is None:
            direction = _gaussian(flat, generator)
        else:
            direction = torch.cat([r[n].reshape(-1) for n in names])
        pieces = orthogonal_direction(flat, direction, projection).split(
            [grads[n].numel() for n in names]
        )
        return {n: p.view_as(grads[n]) for n, p in zip(names, pieces, strict=True)}

    def _public_candidates(
        self, model: nn.Module, grads: Gradients, loss_fn: LossFn, generator: torch.Generator
    ) -> tuple[list[Gradients], list[int]]:
        """T candidates whose directions are gradients of public images, one image per trial."""
        images, labels = self._public_pool()
        device = next(iter(grads.values())).device
        picks = torch.randint(len(labels), (self.settings.trials,), generator=generator)
        drawn, which = torch.unique(picks, return_inverse=True)
        per_image = per_sample_gradients(
            model, images[drawn].to(device), labels[drawn].to(device), loss_fn
        )
        per_drawn = []  # one candidate per drawn image: trials that draw the same image share it
        for k, image in enumerate(drawn.tolist()):
            candidate = self._candidate(grads, generator, {n: per_image[n][k] for n in grads})
            bad = [n for n, c in candidate.items() if not torch.isfinite(c).all()]
            if bad:
                raise ValueError(
                    f"CENSOR (source public): the gradient of public image {image} is zero or "
                    f"parallel to the client's gradient at {bad[0]}, so no orthogonal direction "
                    "can be built from it; check that the public pool shares no image with the "
                    "client's batch"
                )
            per_drawn.append(candidate)
        return [per_drawn[k] for k in which.tolist()], picks.tolist()

    def _public_pool(self) -> tuple[Tensor, Tensor]:
        s = self.settings
        if self.public is None:
            raise ValueError(
                "CENSOR with source: public needs its public pool, (images, labels) as model "
                "inputs: pass public= to build_defense (the train and capture stages pass the "
                f"last public_images={s.public_images} validation images of public_class="
                f"{s.public_class})"
            )
        images, labels = self.public
        if images.ndim != 4 or labels.shape != (images.shape[0],):
            raise ValueError(
                f"CENSOR's public pool must be images (N, C, H, W) and labels (N,); got "
                f"{tuple(images.shape)} and {tuple(labels.shape)}"
            )
        if len(labels) != s.public_images or bool((labels != s.public_class).any()):
            raise ValueError(
                f"CENSOR's public pool must hold public_images={s.public_images} images of "
                f"public_class={s.public_class}; got {len(labels)} with labels "
                f"{sorted(set(labels.tolist()))}"
            )
        return images, labels

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

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        """n CENSOR-style transforms of ``grads`` (CENSOR's Table III attacker, Section V-D):
        Gaussian directions made orthogonal and norm-matched with this defense's ``projection``
        and ``scope``. No selection: the attacker lacks the client's batch that scores the
        candidates. The n directions of a layer come from one ``randn`` call."""
        if self.settings.source == "public":
            raise NotImplementedError(
                "EOT against CENSOR with source: public is not implemented: its directions come "
                "from gradients of public images, which these Gaussian samples would not "
                "reproduce; attack that defense with eot_samples: 0"
            )
        projection = self.settings.projection
        if self.settings.scope == "layer-wise":
            return {k: _orthogonal_samples(g, n, generator, projection) for k, g in grads.items()}
        names = list(grads)
        flat = torch.cat([grads[k].reshape(-1) for k in names])
        out = _orthogonal_samples(flat, n, generator, projection)
        pieces = out.split([grads[k].numel() for k in names], dim=1)
        return {k: p.reshape(n, *grads[k].shape) for k, p in zip(names, pieces, strict=True)}


def _orthogonal_samples(g: Tensor, n: int, generator: torch.Generator, projection: str) -> Tensor:
    r = torch.randn((n, *g.shape), generator=generator, dtype=g.dtype).to(g.device)
    # orthogonal_direction reduces over its whole input: vmap applies it to each of the n draws
    # in one batched pass (measured a little faster than a loop on the CPU)
    return vmap(lambda ri: orthogonal_direction(g, ri, projection))(r)


def _gaussian(g: Tensor, generator: torch.Generator) -> Tensor:
    """r ~ N(0, I) shaped like ``g``, drawn on the generator's device and moved to ``g``'s."""
    r = torch.randn(g.shape, generator=generator, dtype=g.dtype, device=generator.device)
    return r.to(g.device)


def _draw_generator(
    generator: torch.Generator, device: torch.device, draws: Literal["cpu", "device"]
) -> torch.Generator:
    """The CPU generator, or (``draws: device`` off the CPU) one on ``device`` seeded from it."""
    if draws == "cpu" or device.type == "cpu":
        return generator
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


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
