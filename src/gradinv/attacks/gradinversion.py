"""GradInversion (Yin et al., CVPR 2021, arXiv:2104.07586), "GI" in CENSOR's tables.

Threat model: honest-but-curious server. It holds the global model it broadcast (parameters and
the BN running statistics of that global model) and one client's shared update: a FedSGD
gradient, or a FedAvg delta read as the gradient of one equivalent step by
:func:`~gradinv.attacks.matching.target_gradients`. Labels are read from the last layer's
gradient by the row rule of Yin et al. (:func:`~gradinv.attacks.labels.infer_labels`), or
given when ``threat.labels`` is ``known``. The model runs in the victim's mode: in train mode the
B dummies of a restart are normalised by their own batch statistics, as the victim's were.

A group of R restarts x_1..x_R (each a batch of B dummies in the model's normalised input
space, drawn from N(0, 1)) is optimised together. Restart r minimises

    ‖∇θ CE(x_r, y) − g‖² / L                 Euclidean gradient distance over L parameter tensors
    + tv · TV(x_r)                           inversefed's anisotropic TV (matching.total_variation)
    + image_norm · ‖x_r‖₂ / (H·W)            image-norm prior
    + group · ‖x_r − x̄‖₂ / (H·W)             group consistency
    + bn_prior · Σ_l c_l (‖μ_l(x_r) − μ̂_l‖₂ + ‖σ²_l(x_r) − σ̂²_l‖₂)     BN-statistics prior

with Adam, pixels boxed to the valid range after every step. The result is the restart whose
final gradient distance is lowest (``output: best``), not the group mean.

Where this follows public code rather than the paper:

- Group consistency. The paper registers every group member onto the others (RANSAC-flow)
  before averaging them into the consistency target, and fuses the registered group at the end.
  We do what the GIFD code (``inversefed/reconstruction_algorithms.py``, the code CENSOR runs)
  does: x̄ is the plain pixel mean of the R restarts, no registration, first built at iteration
  ``group_start`` (GIFD: 500) and refreshed every ``group_every`` (GIFD: 100), and the penalty is
  that code's unsquared norm divided by H·W. ``output: group-mean`` returns the final x̄, our
  unregistered stand-in for the paper's fused image.
- Distances and priors are scaled as in the GIFD code (its ``l2`` cost, ``image_norm`` and
  ``group_lazy``), so that the weights of its config (TV 1e-4, image norm 1e-6, group 0.01) mean
  the same here. breaching's ``seethroughgradients`` scales differently (0.5·Σ‖·‖² × 1e-4, and
  the norm prior as a mean of squares), so its numbers do not carry over.
- Schedule. ``cosine``: cosine decay to 0 after a linear warm-up of ``warmup`` steps, breaching's
  reading of the paper (``seethroughgradients``: 20 000 iterations, lr 0.1, warm-up 50).
  ``step``: ×0.1 at 3/8, 5/8 and 7/8 of the iterations, what the GIFD code runs for Yin et al.
- ``langevin`` > 0 adds langevin · lr_t · N(0, 1) to the image gradient, as breaching does (its
  default 0.01; it reports the paper's 0.2). Off by default, as in the GIFD code; the noise comes
  from the attack's generator.
- BN prior: DeepInversion's feature-statistics regularizer (NVlabs DeepInversion, breaching's
  ``deep_inversion``, GIFD's ``bn_stat``), the first BN layer weighted c_1 = 10. Off by default
  (``bn_prior: 0``): CENSOR (Section V-B) does not apply it because clients do not share BN
  statistics, and its GIFD config sets ``bn_stat: 0``. When on, μ̂, σ̂² are the running statistics
  of the global model the server broadcast, which it has. The paper's strongest setting matches
  the victim's own batch statistics; that needs ``threat.bn_statistics`` and a capture that
  records them, is not what the server has, and is not implemented.

The R restarts are one (R, B, C, H, W) tensor under one Adam (Adam is elementwise, so this is R
independent Adams), their parameter gradients computed in the layout ``restarts_layout`` picks
(:mod:`gradinv.attacks.restarts`: one ``vmap`` pass, or a loop over the restarts). ``output:
last`` returns the last restart, as the GIFD code's ``choose_optimal`` does.

With a :class:`~gradinv.progress.Progress` the loop saves its state (images, Adam and scheduler
state, generator, group mean, history) and resumes from it bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, Attack, AttackFailed, AttackResult, MatchSettings
from gradinv.attacks.matching import euclidean_distances, total_variation
from gradinv.attacks.restarts import (
    Layout,
    RestartLoss,
    choose_restart,
    initial_dummies,
    log_restarts,
    loop_state,
    resolve_layout,
    restart_gradients,
    resume_loop,
)
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate, denormalize
from gradinv.settings import bounded

FIRST_BN_WEIGHT = 10.0  # DeepInversion, breaching and GIFD weight the first BN layer 10x


@ATTACKS.register("gradinversion")
class GradInversion(Attack):
    @dataclass(frozen=True)
    class Settings(MatchSettings):
        iterations: int = bounded(20_000, ge=1)
        lr: float = bounded(0.1, gt=0.0)
        schedule: Literal["cosine", "step"] = "cosine"
        warmup: int = bounded(50, ge=0, doc="linear warm-up steps of the cosine schedule")
        restarts: int = bounded(4, ge=1, doc="the group: restarts optimised together")
        tv: float = bounded(1e-4, ge=0.0, doc="weight of the total-variation prior")
        image_norm: float = bounded(1e-6, ge=0.0, doc="weight of the image l2-norm prior")
        group: float = bounded(0.01, ge=0.0, doc="weight of the group-consistency term")
        group_start: int = bounded(500, ge=0, doc="iteration the group mean is first built")
        group_every: int = bounded(100, ge=1, doc="iterations between group-mean refreshes")
        bn_prior: float = bounded(
            0.0, ge=0.0, doc="weight of the BN-statistics prior; 0 = off (CENSOR)"
        )
        langevin: float = bounded(0.0, ge=0.0, doc="Langevin noise on the image gradient")
        boxed: bool = True
        output: Literal["best", "last", "group-mean"] = "best"
        restarts_layout: Layout = "auto"
        log_every: int = bounded(25, ge=1)

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        s, meta = self.settings, update.meta
        model, named, target = self.match_target(server, update, device)
        labels = self.private_labels(model, update).to(device)
        batch_norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if s.bn_prior > 0 and not batch_norms:
            raise ValueError("gradinversion: bn_prior > 0 needs a model with batch norm")
        compare = self.gradient_match(update, [n for n, _ in named], target, _gi_distances)
        layout = resolve_layout(s.restarts_layout, model, device, s.restarts)
        gradients = restart_gradients(
            model, named, _restart_loss(labels, batch_norms, s.bn_prior > 0), layout
        )

        def match(x: Tensor, create_graph: bool) -> tuple[Tensor, Tensor]:
            grads, bn = gradients(x, create_graph)
            return compare(grads, generator), bn

        shape = (s.restarts, meta.batch_size, *meta.image_shape)
        mean = torch.tensor(meta.mean, device=device).view(1, 1, -1, 1, 1)
        std = torch.tensor(meta.std, device=device).view(1, 1, -1, 1, 1)
        low, high = (0 - mean) / std, (1 - mean) / std
        pixels = meta.image_shape[1] * meta.image_shape[2]

        x = initial_dummies(s.restarts, shape[1:], generator, device).requires_grad_(True)
        opt = torch.optim.Adam([x], lr=s.lr)
        sched = _scheduler(opt, s.schedule, s.iterations, s.warmup)
        anchor: Tensor | None = None
        history: dict[str, list[tuple[int, float]]] = {}
        start, saved = 0, progress.load() if progress else None
        if saved is not None:
            start, history = resume_loop(saved, x, opt, sched, generator)
            anchor = None if saved["anchor"] is None else saved["anchor"].to(device)
            progress.resumed(f"iteration {start}")

        for it in self.iterations(f"GI, {s.restarts} restart(s) {layout}", start, s.iterations):
            if s.group > 0 and s.restarts > 1 and _refresh(it, s.group_start, s.group_every):
                anchor = x.detach().mean(0)
            opt.zero_grad()
            distance, bn = match(x, True)
            objective = distance + s.tv * torch.stack([total_variation(xr) for xr in x])
            if s.image_norm > 0:
                objective = objective + s.image_norm * x.flatten(1).norm(dim=1) / pixels
            if anchor is not None:
                objective = objective + s.group * (x - anchor).flatten(1).norm(dim=1) / pixels
            if s.bn_prior > 0:
                objective = objective + s.bn_prior * bn
            total = objective.sum()
            if not torch.isfinite(total):
                raise AttackFailed(f"non-finite attack loss at iteration {it}")
            (x.grad,) = torch.autograd.grad(total, x)
            if s.langevin > 0:
                noise = torch.randn(shape, generator=generator).to(device)
                x.grad.add_(noise, alpha=s.langevin * opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            if s.boxed:
                with torch.no_grad():
                    x.data = torch.max(torch.min(x, high), low)
            if it % s.log_every == 0 or it == s.iterations - 1:
                log_restarts(history, it, objective)
                history.setdefault("group_spread", []).append((it, _spread(x.detach())))
            if progress and progress.due():
                group_mean = None if anchor is None else anchor.cpu()
                state = loop_state(it + 1, x, opt, sched, generator, history, anchor=group_mean)
                progress.save(state)

        final = x.detach()
        distances = match(final, False)[0].tolist()
        history["final_gradient_distance"] = list(enumerate(distances))
        best, chosen = choose_restart(distances, s.output)
        summary = {
            "best_restart": best,
            "returned_restart": chosen,
            "gradient_distance": distances[best],
            "returned_gradient_distance": distances[chosen],
            "group_spread": _spread(final),
            "restarts_layout": layout,
        }
        images = final[chosen]
        if s.output == "group-mean":
            images = final.mean(0)
            summary["returned_restart"] = None  # the group mean, not one restart
            summary["returned_gradient_distance"] = match(images[None], False)[0].item()
        images = denormalize(images.cpu(), meta.mean, meta.std).clamp(0, 1)
        return AttackResult(images=images, labels=labels.cpu(), history=history, summary=summary)


def _gi_distances(samples: list[Tensor], target: list[Tensor]) -> Tensor:
    """The GIFD code's ``l2`` cost: the squared Euclidean distance averaged over the layers."""
    return euclidean_distances(samples, target) / len(target)


def _restart_loss(labels: Tensor, batch_norms: list[nn.Module], with_bn: bool) -> RestartLoss:
    """One restart's cross-entropy and, when ``with_bn``, its BN-statistics prior (read from
    hooks on the BN layers' inputs of the forward pass that produced the logits)."""
    inputs: list[Tensor] = []
    if with_bn:
        for bn in batch_norms:
            bn.register_forward_hook(lambda _m, args, _out: inputs.append(args[0]))
    reference = [(b.running_mean.clone(), b.running_var.clone()) for b in batch_norms]

    def bn_prior() -> Tensor:
        terms = []
        for i, (h, (mu, var)) in enumerate(zip(inputs, reference, strict=True)):
            dims = [d for d in range(h.ndim) if d != 1]
            weight = FIRST_BN_WEIGHT if i == 0 else 1.0
            terms.append(
                weight
                * (
                    torch.linalg.vector_norm(h.mean(dims) - mu)
                    + torch.linalg.vector_norm(h.var(dims, unbiased=False) - var)
                )
            )
        inputs.clear()
        return torch.stack(terms).sum()

    def loss_of(logits: Tensor) -> tuple[Tensor, Tensor]:
        loss = F.cross_entropy(logits, labels)
        return loss, bn_prior() if with_bn else loss.new_zeros(())

    return loss_of


def _scheduler(
    opt: torch.optim.Optimizer, kind: str, iterations: int, warmup: int
) -> torch.optim.lr_scheduler.LRScheduler:
    if kind == "step":
        milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)

    def factor(it: int) -> float:
        ramp = min(1.0, (it + 1) / warmup) if warmup else 1.0
        return ramp * 0.5 * (1 + math.cos(math.pi * min(it, iterations) / iterations))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _refresh(it: int, start: int, every: int) -> bool:
    return it >= start and (it - start) % every == 0


def _spread(x: Tensor) -> float:
    """Mean distance of the restarts from their mean, per pixel (RMS): how far the group agrees."""
    return (x - x.mean(0)).pow(2).mean().sqrt().item()
