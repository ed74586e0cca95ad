"""DCS²: Defence by Concealing Sensitive Samples (Wu et al., AAAI 2024; arXiv:2310.04453).

Threat model: an honest-but-curious server that inverts the shared gradient, or a malicious one
that plants an Imprint block (the paper's Table 1). The client protects only the samples it marks
*sensitive*: for each one it synthesizes a *concealed* sample whose gradient resembles the
sensitive sample's while the image itself looks nothing like it, and shares the batch's gradient
mixed with the concealed samples' (Section 2.3):

    x_c = argmin -cos(grad L(x_c, y~_c), grad L(x_s, y_s)) + alpha / ||x_c - x_s||
                 + beta * ||f(x_c) - f(x_s)||                                        (Eq. 5-6)
    g_c = g + lam * grad L(x_c, y~_c) + (1 - lam) * grad L(x_c, y_s)                      (Eq. 7)

f is the model's logits. DCS²+ (``projection: true``) keeps the shared gradient a descent
direction: when <g, g_c> < 0 it shares the closest gradient with <g, g^_c> >= 0, g^_c = g v* + g_c
with v* from the quadratic program of Eq. 9, solved by ``quadprog`` (the solver of the official
code, which follows GEM's ``project2cone2``). An attack reconstructs the shared batch, concealed
samples included (the client reports them in its batch size); the paper scores only the
sensitive samples, and so does the score stage (``self.last["sensitive"]``).

Paper and official code (``dlg/defenses/dcs.py``; ../shared/research) differ; each difference is
a setting, the paper's behaviour the default:
- ``objective: paper | code``: Eq. 6, or the code's (1 - cos) + exp(-0.01 ||x_c - x_s||)
  + 0.01 (||f(x_c) - f(x_s)|| / ||f(x_s)|| - 0.01).
- ``init: start | mixup``: the concealed sample starts at its start point (the paper), or at the
  code's mixup ``mixup`` * start + (1 - ``mixup``) * x_s (0.7).
- ``mixing: augmented | literal``: the paper says that with lambda = 1 Eq. 7 "is the gradient
  of the mini-batch augmented by the concealed sample". With the mean loss of this pipeline (and
  of the code) that is the mean over the augmented batch [concealed; batch],
  (B g + sum_c [...]) / (B + K), the default, which the code computes. ``literal`` adds the
  concealed samples' gradients to the batch's mean gradient as Eq. 7 is printed: a concealed
  sample then weighs as much as the whole batch, and FL training at batch 16 stops learning
  (tests/test_dcs2.py).
- ``margin``: the code's GEM margin (0.5) makes the constraint v >= margin; the paper's is 0.
- The code stops a concealed sample's search early once ||x_c - x_s|| exceeds a threshold
  (150, or 500 in its scripts): ``stop_distance`` (0: never, the paper).

Choices where both are silent:
- Start points (Section 2.3, Remark; Table 4): ``batch``: another sample of the batch, one with a
  different label first (Appendix A.3: a different label conceals better), y~_c its label;
  ``noise``: uniform noise in [0, 1], y~_c drawn at random; ``public``: an image of the public pool
  (Table 4's QMNIST, a neighbouring dataset) with a different label (the pool is CENSOR's: the
  last ``public_images`` validation images of one class, so a sensitive sample of that class gets
  a start of its own label); ``auto``: ``batch`` when the
  batch has another sample, else ``noise`` (a batch of one image), recorded per update.
- Sensitive samples: ``sensitive: fraction`` marks the first ceil(fraction * B) samples of the
  batch (a client's batch is a random draw, so this is a random choice), ``count`` the first
  ``count`` samples (the official code's ``num_sen``, 1), ``labels`` every sample whose label is
  listed (Table 3's "only the digit 6 needs protection").
- ``noise_std`` adds Gaussian noise to the shared gradient after everything else (Table 3's
  "DCS² + Gaussian", which protects every sample while DCS² conceals the sensitive ones).
- The search is Adam at ``lr`` (the code's 0.1) on the concealed samples as model inputs, each
  sample's objective summed; the distances are on model inputs, as in the code. With ``box``
  the concealed samples stay valid images (pixels clamped to [0, 1] after every step): a
  concealed "image" far outside the pixel range would give itself away.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Literal

import numpy as np
import quadprog
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.defenses import DEFENSES
from gradinv.defenses.base import Defense, Gradients, LossFn, gradients_of, per_sample_gradients
from gradinv.models import buffers_kept, classifier_layer
from gradinv.protocol import normalize
from gradinv.sensitive import sensitive_samples
from gradinv.settings import bounded


@DEFENSES.register("dcs2")
class DCS2(Defense):
    """Share the batch's gradient obfuscated by concealed samples (DCS²); projected, DCS²+."""

    @dataclass(frozen=True)
    class Settings:
        sensitive: Literal["fraction", "count", "labels"] = "fraction"
        count: int = bounded(1, ge=1, doc="sensitive: count: the first `count` samples (the code)")
        fraction: float = bounded(
            0.5, gt=0.0, le=1.0, doc="sensitive: fraction: the first ceil(fraction * B) samples"
        )
        labels: tuple[int, ...] = ()  # sensitive: labels: the classes that need protection
        concealed: int = bounded(1, ge=1, doc="concealed samples per sensitive sample (Table 7)")
        start: Literal["auto", "batch", "noise", "public"] = "auto"
        public_class: int = bounded(0, ge=0, doc="start public: the class of the public pool")
        public_images: int = bounded(
            16, ge=1, doc="start public: the pool, the last N validation images of public_class"
        )
        init: Literal["start", "mixup"] = "start"
        mixup: float = bounded(0.7, ge=0.0, le=1.0, doc="init mixup: the start point's weight")
        objective: Literal["paper", "code"] = "paper"
        alpha: float = bounded(0.1, ge=0.0, doc="Eq. 5: weight of 1 / ||x_c - x_s||")
        beta: float = bounded(0.001, ge=0.0, doc="Eq. 6: weight of the logit distance")
        iterations: int = bounded(1000, ge=0, doc="T: Adam steps of the search")
        lr: float = bounded(0.1, gt=0.0, doc="Adam's step size (the code's 0.1)")
        stop_distance: float = bounded(0.0, ge=0.0, doc="the code's early stop; 0: never")
        box: bool = True  # keep concealed samples valid images (pixels in [0, 1])
        lam: float = bounded(0.3, ge=0.0, le=1.0, doc="Eq. 7: lambda, the concealed label's share")
        mixing: Literal["augmented", "literal"] = "augmented"
        projection: bool = False  # DCS²+: keep <g, g_c> >= 0 (Eq. 8-9)
        margin: float = bounded(0.0, ge=0.0, doc="the QP's v >= margin (the code: 0.5)")
        noise_std: float = bounded(
            0.0, ge=0.0, doc="Table 3's DCS² + Gaussian: noise of this std on the shared gradient"
        )

    protects_samples_by = ("sensitive", "count", "fraction", "labels")

    @classmethod
    def uses_public(cls, settings: Settings) -> bool:
        return settings.start == "public"

    def sensitive_indices(self, labels: Tensor) -> list[int]:
        """The batch's samples this client protects (see the module doc)."""
        s = self.settings
        rule = {"sensitive": s.sensitive, "count": s.count, "fraction": s.fraction}
        return sensitive_samples(rule | {"labels": s.labels}, labels.tolist())

    def shared_batch_size(self, labels: Tensor) -> int:
        return len(labels) + self.settings.concealed * len(self.sensitive_indices(labels))

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        s = self.settings
        sensitive = self.sensitive_indices(labels)
        self.last = {"sensitive": sensitive, "concealed": 0, "projected": False}
        if not sensitive:  # nothing to protect in this batch: the plain gradient
            g = {n: v.detach() for n, v in gradients_of(model, inputs, labels, loss_fn).items()}
            return self._noised(g, generator)
        # Batch-norm statistics move once, with the pass whose gradient is shared: the augmented
        # batch's (or, for Eq. 7 as printed, the batch's); every other pass keeps them.
        with buffers_kept(model) if s.mixing == "augmented" else nullcontext():
            g = {n: v.detach() for n, v in gradients_of(model, inputs, labels, loss_fn).items()}
        owners = [i for i in sensitive for _ in range(s.concealed)]
        num_classes = classifier_layer(model)[1].out_features
        starts, start_labels, used = self._starts(inputs, labels, owners, num_classes, generator)
        targets = inputs[owners].detach()
        if s.init == "mixup":
            starts = s.mixup * starts + (1 - s.mixup) * targets
        with buffers_kept(model):
            concealed, objectives = self._conceal(
                model, starts, start_labels, targets, labels[owners], loss_fn
            )
        g_c = self._mix(model, inputs, labels, g, concealed, start_labels, labels[owners], loss_fn)
        cosine = _dot(g, g_c) / math.sqrt(_dot(g, g) * _dot(g_c, g_c) + 1e-30)
        projected = s.projection and _dot(g, g_c) < 0
        if projected:
            g_c = self._project(g, g_c)
        self.last = {
            "sensitive": sensitive,
            "concealed": len(owners),
            "start": used,
            "objective_start": objectives[0] if objectives else None,
            "objective": objectives[-1] if objectives else None,
            "cosine_before_projection": cosine,
            "projected": projected,
            "input_distance": float((concealed - targets).flatten(1).norm(dim=1).mean()),
        }
        return self._noised(g_c, generator)

    def _noised(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        """Table 3's combination with DP: Gaussian noise of ``noise_std`` on every entry of the
        shared gradient, after the concealment (and projection), drawn on the CPU."""
        std = self.settings.noise_std
        if std == 0:
            return grads
        return {
            n: g + std * torch.randn(g.shape, generator=generator).to(g) for n, g in grads.items()
        }

    def _starts(
        self,
        inputs: Tensor,
        labels: Tensor,
        owners: list[int],
        num_classes: int,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor, str]:
        """Each concealed sample's start point and label, and which kind of start was used."""
        s = self.settings
        start = s.start
        if start == "auto":
            start = "batch" if len(labels) > 1 else "noise"
        if start == "batch":
            if len(labels) < 2:
                raise ValueError(
                    "DCS² start: batch needs another sample in the batch, but the batch holds "
                    "one image; use start: noise or public (or auto)"
                )
            picks = [self._other(labels, i, k) for k, i in enumerate(owners)]
            return inputs[picks].detach(), labels[picks], "batch"
        if start == "public":
            if self.public is None:
                raise ValueError(
                    "DCS² start: public needs the public pool; the pipeline passes it to "
                    "build_defense(..., public=...) when uses_public says so"
                )
            pool, pool_labels = self.public
            picks = []
            for i in owners:
                other = (pool_labels != labels[i]).nonzero().flatten()
                choice = other if len(other) else torch.arange(len(pool_labels))
                picks.append(int(choice[torch.randint(len(choice), (1,), generator=generator)]))
            return pool[picks].to(inputs), pool_labels[picks].to(labels), "public"
        if self.normalization is None:
            raise ValueError("DCS² start: noise needs the dataset's mean and std (normalization)")
        mean, std = self.normalization
        noise = torch.rand((len(owners), *inputs.shape[1:]), generator=generator)
        random_labels = torch.randint(num_classes, (len(owners),), generator=generator)
        return normalize(noise, mean, std).to(inputs), random_labels.to(labels), "noise"

    @staticmethod
    def _other(labels: Tensor, i: int, k: int) -> int:
        """The k-th start point for sensitive sample i: another sample of the batch, those with
        a different label first, cycling when more concealed samples than candidates."""
        others = [j for j in range(len(labels)) if j != i]
        others.sort(key=lambda j: int(labels[j] == labels[i]))  # stable: different labels first
        return others[k % len(others)]

    def _conceal(
        self,
        model: nn.Module,
        starts: Tensor,
        start_labels: Tensor,
        targets: Tensor,
        target_labels: Tensor,
        loss_fn: LossFn,
    ) -> tuple[Tensor, list[float]]:
        """The concealed samples after the search of Eq. 6 (each against its own sensitive
        sample; every sample's gradient alone, all in one batched pass), and the summed
        objective at every step."""
        s = self.settings
        box = self._box(starts) if s.box else None
        target_grads = _rows(per_sample_gradients(model, targets, target_labels, loss_fn))
        with torch.no_grad():
            target_logits = model(targets)
        x = starts.detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([x], lr=s.lr)
        active = torch.ones(len(x), dtype=torch.bool, device=x.device)
        stopped = x.detach().clone()  # a sample that stopped early stays where it stopped
        values = []
        for _ in range(s.iterations):
            grads = _rows(per_sample_gradients(model, x, start_labels, loss_fn))
            cosine = F.cosine_similarity(grads, target_grads, dim=1)
            objective = self._objective(cosine, x, targets, model(x), target_logits)
            values.append(float(objective.detach().sum()))
            # the gradient of x alone: the model's parameters keep no .grad from the search
            (x.grad,) = torch.autograd.grad(objective.sum(), x)
            optimizer.step()
            with torch.no_grad():
                if box is not None:
                    x.copy_(torch.maximum(torch.minimum(x, box[1]), box[0]))
                x[~active] = stopped[~active]  # Adam's momentum would move them on
                if s.stop_distance > 0:
                    now = active & ((x - targets).flatten(1).norm(dim=1) <= s.stop_distance)
                    stopped[active & ~now] = x[active & ~now]
                    active = now
            if not active.any():
                break
        return x.detach(), values

    def _box(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """The model inputs of pixels 0 and 1, per channel."""
        if self.normalization is None:
            raise ValueError("DCS² box: true needs the dataset's mean and std (normalization)")
        mean, std = self.normalization
        ends = normalize(
            torch.tensor([0.0, 1.0]).view(2, 1, 1, 1).expand(2, like.shape[1], 1, 1), mean, std
        )
        return ends[0:1].to(like), ends[1:2].to(like)

    def _objective(
        self, cosine: Tensor, x: Tensor, targets: Tensor, logits: Tensor, target_logits: Tensor
    ) -> Tensor:
        """Each concealed sample's objective (Eq. 6, or the code's), shape (K,)."""
        s = self.settings
        distance = (x - targets).flatten(1).norm(dim=1)
        logit_distance = (logits - target_logits).norm(dim=1)
        if s.objective == "paper":
            return -cosine + s.alpha / (distance + 1e-12) + s.beta * logit_distance
        return (  # the official code's
            (1 - cosine)
            + torch.exp(-0.01 * distance)
            + 0.01 * (logit_distance / (target_logits.norm(dim=1) + 1e-12) - 0.01)
        )

    def _mix(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        g: Gradients,
        concealed: Tensor,
        concealed_labels: Tensor,
        sensitive_labels: Tensor,
        loss_fn: LossFn,
    ) -> Gradients:
        """Eq. 7. ``augmented``: the gradient of one pass over [concealed; batch], each concealed
        sample's loss lam * L(x_c, y~_c) + (1 - lam) * L(x_c, y_s), the mean over B + K samples
        (exact with train-mode batch norm, as the code's pass over the augmented batch);
        ``literal``: g plus the concealed samples' summed gradients, as printed."""
        s, k, b = self.settings, len(concealed), len(labels)

        def mixture(logits: Tensor) -> Tensor:  # the mean of the concealed samples' losses
            own = loss_fn(logits, concealed_labels)
            return s.lam * own + (1 - s.lam) * loss_fn(logits, sensitive_labels)

        if s.mixing == "literal":
            with buffers_kept(model):
                extra = gradients_of(
                    model, concealed, concealed_labels, lambda o, _: k * mixture(o)
                )
            return {n: g[n] + extra[n].detach() for n in g}

        def augmented(logits: Tensor, _: Tensor) -> Tensor:
            return (k * mixture(logits[:k]) + b * loss_fn(logits[k:], labels)) / (k + b)

        joint = torch.cat([concealed, inputs.detach()])
        joint_labels = torch.cat([concealed_labels, labels])  # the labels the loss reads
        return {
            n: v.detach() for n, v in gradients_of(model, joint, joint_labels, augmented).items()
        }

    def _project(self, g: Gradients, g_c: Gradients) -> Gradients:
        """Eq. 8-9: g^_c = g v* + g_c, v* = argmin 1/2 g'g v^2 + g_c'g v s.t. v >= margin."""
        gg, cg = _dot(g, g), _dot(g_c, g)
        solution = quadprog.solve_qp(
            np.array([[gg]]),  # quadprog minimizes 1/2 v'Gv - a'v subject to C'v >= b
            np.array([-cg]),
            np.array([[1.0]]),
            np.array([self.settings.margin]),
        )
        v = float(solution[0][0])
        return {n: g_c[n] + v * g[n] for n in g}


def _rows(grads: Gradients) -> Tensor:
    """Per-sample gradients (per layer (K, *shape)) as one (K, parameters) matrix."""
    return torch.cat([v.flatten(1) for v in grads.values()], dim=1)


def _dot(a: Gradients, b: Gradients) -> float:
    return float(sum((a[n].double() * b[n].double()).sum() for n in a))
