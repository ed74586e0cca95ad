"""CENSOR (Zhang et al., NDSS 2025, Section IV and Algorithm 1): share an orthogonal gradient.

The client computes its gradient G0, then for each of T trials draws a random direction for every
layer l, removes its projection onto g_l and rescales it to ‖g_l‖ (or, with ``scope:
whole-model``, does the same once for the whole flattened gradient, Table VII). It scores each
candidate G_t by the loss of θ − η·G_t on its own batch and shares the candidate with the lowest
loss, if that loss is below the loss at θ. Random draws come from the CPU generator, trial by
trial and layer by layer, so one seed gives the same update on any device (``draws: cpu``). On a
GPU that costs the most time of the update (T × the model's size of normal numbers made on the
CPU and copied over, and T × the layers' small projections one after another): ``draws: device``
makes each layer's T directions in one call on the gradients' device (on a GPU from a generator
seeded by the CPU one, on the CPU from the CPU generator itself) and projects them in one
``vmap`` pass. A seed still fixes the update on a given device, but the draws come in another
order than with ``draws: cpu``, so the two settings share other candidates, and a GPU run no
longer matches a CPU run.

**When no candidate beats the undefended loss** the paper says two things (``fallback``):

- ``algorithm-1`` (the default): Algorithm 1 as printed, lines 10-11 and 17-20::

      10: ℓ⋆ ← EVALUATE(f_θτ, D^k)   ▷ Initialize the best loss
      11: G⋆ = G0                     ▷ Initialize the best gradient

  and G⋆ is replaced only by a candidate whose loss is strictly lower (line 17), so when none
  is, line 20 returns G0: the client shares its raw gradient, unprotected. The official code
  (``defense.py``, ``orthogonal_gradient``) does the same: ``best_loss`` starts at the
  undefended loss and the original gradient is returned when no candidate beats it. The
  pseudocode is the paper's most precise statement and the code agrees with it, hence the
  default. Each update records whether it shared G0 (``raw_gradient_shared``), and a
  :class:`CensorFallbackWarning` says so.
- ``never-raw``: the prose of the introduction, "restricting our parameter sampling to an
  orthogonal subspace means we will not inadvertently return the original gradients": the best
  orthogonal candidate is shared whatever its loss.

The two names that said "paper" and "code" before (``best-candidate``, ``as-coded``) are refused
with the new names: the raw-gradient fallback is the paper's own pseudocode, not a departure of
the code.

**Which subspace** (``subspace``): Algorithm 1 (lines 24-30) and Eq. 12 make each layer's
candidate orthogonal to the batch gradient g_l; this is the default, ``batch``. Eq. 11 defines
the subspace as orthogonal to the gradient of *every training instance* of the batch, k vectors
(``per-sample``: each layer's candidate is orthogonal to the k per-sample gradients and to g_l,
:mod:`gradinv.defenses.orthogonal`); with a batch of one the two coincide. Eq. 11 as printed
also quantifies over every class c ∈ [1, C], which reads as the gradient of each instance under
each label: ``per-sample-every-label`` (k·C vectors; a layer with no more elements than that has
no orthogonal direction left and shares zero).

**Model mode** (``mode``): G0 (line 9), the undefended loss (line 10) and the candidates' losses
(line 16) are taken in one mode, so that the candidates, orthogonal to G0, have no first-order
term in the loss that selects them. ``model`` (the default) uses the mode the client's model is
in: the threat model's ``model_mode`` when a victim's update is captured, training mode in FL
training. ``eval`` and ``train`` force one (the official code computes all three in eval mode).
Scoring never changes the model's batch-norm running statistics.

The official code (KaiyuanZh/censor, ``defense.py``) also differs from the paper's text; each
difference is a setting, with the paper's behaviour as the default:

- ``projection``: ``exact`` removes the component along g (the paper's Eq. 12), so every
  candidate is orthogonal to g. ``as-coded`` draws r with unit norm and removes (r·g/‖g‖)·g,
  which is orthogonal only when ‖g‖ = 1: on small-norm layers (biases, batch-norm) the
  candidate keeps a component along g of about (r·ĝ)(1 − ‖g‖).
- ``selection_lr``: η of the candidate loss; 0 uses the learning rate of the update the client
  takes (``fl.lr`` under FedSGD, ``fl.local_lr`` under FedAvg), the code fixes 1e-4.
- ``scope``: ``layer-wise`` (Algorithm 1) or ``whole-model`` (Table VII).
- ``trials``: T (20 in the paper and the code).

``source`` says where the random directions come from. ``gaussian`` (Algorithm 1, the default)
draws r ~ N(0, I). ``public`` follows Section V-E ("Effect of Sampling from a Public Dataset",
Fig. 10): the directions are gradients of public images of one class (``public_class``), and a
GAN-based attack then reconstructs images of that class. The paper does not say how the vectors
are built from the images. Here each trial draws one image of the public pool uniformly (from the
same CPU generator), takes the gradient of the loss on that image alone, with its label, at the
current parameters and in the selection's mode (batch-norm buffers left untouched), and uses
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
the code's η = 1e-4 in float32 their losses differ from L(θ) by float resolution alone, and under
``algorithm-1`` the raw gradient is then shared about as often as not. With the ``as-coded``
projection the lowest loss goes to the candidate with the largest leftover component along g:
the selection picks the direction that leaks most. Every update records whether no candidate
beat the undefended loss, whether the raw gradient was shared, and the cosine between the shared
update and the true gradient (:attr:`Censor.stats`, :meth:`Censor.rates`), so both effects show
in the results.

Candidates are scored one after another (``evaluation: sequential``) or in one batched pass with
``torch.func.vmap`` over stacked parameters (``batched``); ``auto`` batches on a GPU and loops on
the CPU, where the loop measured faster. Both select the same candidate.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
from gradinv.defenses.orthogonal import (
    orthogonal_direction,
    orthogonal_samples,
    orthonormal_basis,
)
from gradinv.models import buffers_kept
from gradinv.settings import ConfigError, bounded, choice


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
        fallback: Literal["algorithm-1", "never-raw"] = choice(
            "algorithm-1",
            renamed={"as-coded": "algorithm-1", "best-candidate": "never-raw"},
            doc="no candidate beats the undefended loss: share G0 (Algorithm 1, lines 10-11) "
            "or the best candidate (the prose: never the raw gradient)",
        )
        subspace: Literal["batch", "per-sample", "per-sample-every-label"] = choice(
            "batch",
            doc="orthogonal to the batch gradient (Alg. 1, Eq. 12) or to each sample's "
            "gradient (Eq. 11), or to each sample's under every label (Eq. 11's ∀c)",
        )
        mode: Literal["model", "eval", "train"] = choice(
            "model",
            doc="the model mode of G0 and of every loss: the model's own (the threat "
            "model's model_mode at capture), or forced",
        )
        scope: Literal["layer-wise", "whole-model"] = "layer-wise"
        evaluation: Literal["auto", "sequential", "batched"] = "auto"
        draws: Literal["cpu", "device"] = choice(
            "cpu",
            doc="cpu: trial by trial on the CPU generator (the same update on any device); "
            "device: each layer's T directions at once on the gradients' device (fast on a GPU)",
        )
        source: Literal["gaussian", "public"] = "gaussian"
        public_class: int = bounded(0, ge=0, doc="source public: the class of the public images")
        public_images: int = bounded(
            16, ge=1, doc="source public: the pool, the last N validation images of public_class"
        )

        def __post_init__(self) -> None:
            if self.projection == "as-coded" and self.subspace != "batch":
                raise ConfigError(
                    f"projection as-coded is the official code's formula for one vector, g; "
                    f"subspace {self.subspace} needs the exact projection: set projection: "
                    "exact, or subspace: batch"
                )

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.stats = {"updates": 0, "fallbacks": 0, "raw_shared": 0, "cosine_sum": 0.0}

    def state_dict(self) -> dict[str, Any]:
        """The counters behind the training summary's ``defense_stats``: a resumed run goes on
        counting from where it stopped."""
        return {"stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.update(state.get("stats", {}))  # progress saved before it kept them: none

    def rates(self, before: dict[str, Any]) -> dict[str, float]:
        """Since the counters stood at ``before`` (a round's start): the share of updates in
        which no candidate beat the undefended loss, and the share that were the raw gradient."""
        n = self.stats["updates"] - before.get("updates", 0)
        if n <= 0:
            return {}
        fallbacks = self.stats["fallbacks"] - before.get("fallbacks", 0)
        raw = self.stats["raw_shared"] - before.get("raw_shared", 0)
        return {"fallback_rate": fallbacks / n, "raw_gradient_rate": raw / n}

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
        with _in_mode(model, s.mode):
            # Line 9, G0: the client's own training step (in train mode it updates batch-norm
            # statistics, as any client's does); nothing after it does.
            original = {
                n: g.detach() for n, g in gradients_of(model, inputs, labels, loss_fn).items()
            }
            basis = self._basis(model, inputs, labels, loss_fn, original)
            picks: list[int] = []  # source public: the pool image of each trial
            stacked = None  # draws: device: the T candidates of each layer in one tensor
            if s.source == "public":
                candidates, picks = self._public_candidates(
                    model, original, loss_fn, generator, basis
                )
            else:
                draw = _draw_generator(generator, next(iter(original.values())).device, s.draws)
                if s.draws == "device":
                    stacked = self._candidates_at_once(original, draw, basis)
                    candidates = [{n: t[i] for n, t in stacked.items()} for i in range(s.trials)]
                else:
                    candidates = [
                        self._candidate(original, draw, basis=basis) for _ in range(s.trials)
                    ]
            base_loss, losses = self._losses(
                model, inputs, labels, loss_fn, candidates, eta, stacked
            )
            mode = "train" if model.training else "eval"
        best = int(torch.argmin(losses))
        fired = not bool(losses[best] < base_loss)  # line 17: strictly lower, or G⋆ stays G0
        raw = fired and s.fallback == "algorithm-1"
        shared = original if raw else candidates[best]
        if stacked is not None and not raw:  # a copy: a view would keep (and save) all T
            shared = {n: t.clone() for n, t in shared.items()}
        if raw:
            warnings.warn(
                "CENSOR (fallback: algorithm-1): no candidate lowered the loss, so the client "
                "shares its raw gradient G0 (Algorithm 1, lines 11 and 20), unprotected",
                CensorFallbackWarning,
                stacklevel=2,
            )
        finite = torch.stack([torch.isfinite(t).all() for t in shared.values()])
        if not finite.all():  # one wait for the GPU, not one per layer
            bad = [n for n, ok in zip(shared, finite.tolist(), strict=True) if not ok]
            raise FloatingPointError(
                f"CENSOR: the shared update is not finite at {bad[0]} (the client's gradient "
                "was not finite there): nothing is shared, and no statistic is computed from it"
            )
        cosine = gradient_cosine(shared, original)
        self.stats["updates"] += 1
        self.stats["fallbacks"] += int(fired)
        self.stats["raw_shared"] += int(raw)
        self.stats["cosine_sum"] += cosine if cosine is not None else 0.0
        self.last = {
            "losses": losses.tolist(),
            "base_loss": float(base_loss),
            "selected": best,
            "fallback_fired": fired,
            "raw_gradient_shared": raw,
            "cosine": cosine,
            "mode": mode,
        }
        if s.source == "public":
            self.last["public_image"] = picks[best]  # index into the pool of the shared direction
        return shared

    def _basis(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        grads: Gradients,
    ) -> dict[str, Tensor] | Tensor | None:
        """The orthonormal basis each candidate is made orthogonal to, per layer (or, whole-model,
        one for the flattened model): for ``subspace: batch`` the unit gradient ĝ (None with the
        code's projection, which takes g itself); else a basis spanning the batch's per-sample
        gradients (Eq. 11) and g."""
        s = self.settings
        if s.subspace == "batch":
            if s.projection != "exact":
                return None
            if s.scope == "layer-wise":  # ĝ per layer, once for the T draws
                return {n: _unit(g) for n, g in grads.items()}
            return _unit(torch.cat([g.reshape(-1) for g in grads.values()]))
        x, y = inputs, labels
        if s.subspace == "per-sample-every-label":  # each instance under each label c
            classes = _num_classes(model, inputs)
            x = inputs.repeat_interleave(classes, dim=0)
            y = torch.arange(classes, device=labels.device).repeat(len(labels))
        per_sample = per_sample_gradients(model, x, y, loss_fn)
        if s.scope == "layer-wise":
            return {
                n: orthonormal_basis(torch.cat([per_sample[n].flatten(1), g.reshape(1, -1)]))
                for n, g in grads.items()
            }
        names = list(grads)
        rows = torch.cat([per_sample[n].flatten(1) for n in names], dim=1)
        flat = torch.cat([grads[n].reshape(1, -1) for n in names], dim=1)
        return orthonormal_basis(torch.cat([rows, flat]))

    def _candidate(
        self,
        grads: Gradients,
        generator: torch.Generator,
        r: Gradients | None = None,
        basis: dict[str, Tensor] | Tensor | None = None,
    ) -> Gradients:
        """One orthogonal, norm-matched gradient (Algorithm 1, ORTHOGONAL_GRAD + NORMALIZE_GRAD).

        ``r`` is the random direction of every layer; None draws a Gaussian one, layer by layer
        (or once for the whole flattened gradient). ``basis``: see :meth:`_basis`.
        """
        projection = self.settings.projection
        if self.settings.scope == "layer-wise":
            out = {}
            for n, g in grads.items():
                direction = _gaussian(g, generator) if r is None else r[n]
                layer_basis = None if basis is None else basis[n]
                out[n] = orthogonal_direction(g, direction, projection, layer_basis)
            return out
        names = list(grads)
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        if r is None:
            direction = _gaussian(flat, generator)
        else:
            direction = torch.cat([r[n].reshape(-1) for n in names])
        pieces = orthogonal_direction(flat, direction, projection, basis).split(
            [grads[n].numel() for n in names]
        )
        return {n: p.view_as(grads[n]) for n, p in zip(names, pieces, strict=True)}

    def _candidates_at_once(
        self,
        grads: Gradients,
        generator: torch.Generator,
        basis: dict[str, Tensor] | Tensor | None,
    ) -> Gradients:
        """The T candidates of ``draws: device``, stacked per layer ((T, *shape)): each layer's T
        Gaussian directions (or, whole model, the T flattened ones) from one ``randn`` call on the
        generator's device, made orthogonal and norm-matched in one ``vmap`` pass. Candidate t is
        what :meth:`_candidate` makes from the t-th directions; this costs one draw and one
        projection per layer instead of T, and no wait for the GPU per trial."""
        s = self.settings

        def directions(like: Tensor) -> Tensor:
            shape = (s.trials, *like.shape)
            r = torch.randn(shape, generator=generator, dtype=like.dtype, device=generator.device)
            return r.to(like.device)

        def project(g: Tensor, b: Tensor | None) -> Tensor:  # the T directions of g, at once
            return vmap(lambda r: orthogonal_direction(g, r, s.projection, b))(directions(g))

        if s.scope == "layer-wise":
            return {n: project(g, None if basis is None else basis[n]) for n, g in grads.items()}
        names = list(grads)
        flat = torch.cat([grads[n].reshape(-1) for n in names])
        pieces = project(flat, basis).split([grads[n].numel() for n in names], dim=1)
        return {n: p.reshape(s.trials, *grads[n].shape) for n, p in zip(names, pieces, strict=True)}

    def _public_candidates(
        self,
        model: nn.Module,
        grads: Gradients,
        loss_fn: LossFn,
        generator: torch.Generator,
        basis: dict[str, Tensor] | Tensor | None,
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
            r = {n: per_image[n][k] for n in grads}
            candidate = self._candidate(grads, generator, r, basis)
            flat = lambda d: torch.cat([t.reshape(-1) for t in d.values()])  # noqa: E731
            if not flat(candidate).any() and flat(grads).any():
                raise ValueError(
                    f"CENSOR (source public): the gradient of public image {image} lies in the "
                    "span of the client's gradient, so no orthogonal direction can be built from "
                    "it; check that the public pool shares no image with the client's batch"
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
        stacked: Gradients | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The loss at θ (line 10) and at θ − η·G_t for each candidate (lines 15-16), in the
        model's current mode. In train mode batch norm updates its running statistics in each
        forward pass: every pass gets its own copy of them, so the model's stay as they were.
        ``stacked``: the same candidates stacked per layer, when they come so (one subtraction
        per layer for the batched pass instead of T)."""
        params = {n: p.detach() for n, p in model.named_parameters()}
        buffers = dict(model.named_buffers())
        training = model.training and bool(buffers)

        def own(bufs: dict[str, Tensor]) -> dict[str, Tensor]:
            return {n: b.clone() for n, b in bufs.items()} if training else bufs

        with torch.no_grad():
            base = loss_fn(functional_call(model, {**params, **own(buffers)}, (inputs,)), labels)
            if self._batched(inputs):
                t = len(candidates)
                if stacked is not None:
                    moved = {
                        n: p - eta * stacked[n] if n in stacked else p.expand(t, *p.shape)
                        for n, p in params.items()
                    }
                else:
                    moved = {
                        n: torch.stack([p - eta * c[n] if n in c else p for c in candidates])
                        for n, p in params.items()
                    }
                copies, buffer_dim = buffers, None
                if training:
                    copies = {n: b.expand(t, *b.shape).clone() for n, b in buffers.items()}
                    buffer_dim = 0

                def loss_of(p: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
                    return loss_fn(functional_call(model, {**p, **b}, (inputs,)), labels)

                batched = vmap(loss_of, in_dims=(0, buffer_dim), randomness="different")
                return base, batched(moved, copies)
            losses = []
            for c in candidates:
                moved = {n: p - eta * c[n] if n in c else p for n, p in params.items()}
                out = functional_call(model, {**moved, **own(buffers)}, (inputs,))
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
        s = self.settings
        if s.source == "public" or s.subspace != "batch":
            what = "source: public" if s.source == "public" else f"subspace: {s.subspace}"
            raise NotImplementedError(
                f"EOT against CENSOR with {what} is not implemented: its directions depend on "
                "gradients the attacker does not have (public images' or each private sample's), "
                "which these samples orthogonal to the dummy gradient would not reproduce; "
                "attack that defense with eot_samples: 0"
            )
        if s.scope == "layer-wise":
            return {k: orthogonal_samples(g, n, generator, s.projection) for k, g in grads.items()}
        names = list(grads)
        flat = torch.cat([grads[k].reshape(-1) for k in names])
        out = orthogonal_samples(flat, n, generator, s.projection)
        pieces = out.split([grads[k].numel() for k in names], dim=1)
        return {k: p.reshape(n, *grads[k].shape) for k, p in zip(names, pieces, strict=True)}


@contextmanager
def _in_mode(model: nn.Module, mode: str) -> Iterator[None]:
    """The model in ``mode`` (``model``: as it is) for the block, then as it was."""
    was_training = model.training
    if mode != "model":
        model.train(mode == "train")
    try:
        yield
    finally:
        model.train(was_training)


def _num_classes(model: nn.Module, inputs: Tensor) -> int:
    """C, the width of the model's output (Eq. 11's ∀c ∈ [1, C])."""
    with torch.no_grad(), buffers_kept(model):
        return int(model(inputs[:1]).shape[-1])


def _unit(g: Tensor) -> Tensor | None:
    """ĝ flattened, or None for a zero gradient (whose candidate is zero anyway)."""
    norm = g.norm()
    return (g / norm).reshape(-1) if norm > 0 else None


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


__all__ = ["Censor", "CensorFallbackWarning", "orthogonal_direction"]
