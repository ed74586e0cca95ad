"""Inverting Gradients (Geiping et al. 2020, arXiv:2003.14053).

Threat model: honest-but-curious server, one shared gradient, labels inferred (or known).
Optimise dummy images in the model's normalised input space to minimise the cosine distance
between their gradient and the shared one, plus a total-variation prior; Adam with step decay at
3/8, 5/8 and 7/8 of the iterations; pixels boxed to the valid range after every step; optionally
the sign of the image gradient (the paper's choice).

R restarts run together, stacked into one (R, B, C, H, W) tensor under one Adam (elementwise, so
R independent runs), their parameter gradients computed in the layout ``restarts_layout`` picks
(:mod:`gradinv.attacks.restarts`: one ``vmap`` pass, or a loop; ``auto`` takes the one measured
faster for the model and device). The result is
the restart whose final gradient distance is lowest (``output: best``). The GIFD code, which
CENSOR runs, returns the *last* restart's image while reporting the best one's score
(``choose_optimal``); ``output: last`` reproduces that.

The paper and the GIFD/CENSOR code differ; each is a setting (``params.yaml``: ``ig_paper``,
``ig_code``): ``signed`` (the paper's sign of the image gradient, not in the code),
``nonzero_only`` (the code's cosine over the target's non-zero entries) and the iteration count
(24 000 in the paper, 15 000 in the code).

Every attack's adaptive settings apply (:class:`~gradinv.attacks.base.MatchSettings`): EOT with
``eot_samples`` > 0 is the adaptive attack of CENSOR's Table III (NDSS 2025, Section V-D); the
final distance that picks the restart is then the same EOT loss on fresh samples.

With a :class:`~gradinv.progress.Progress` the loop saves its state (images, Adam and scheduler
state, generator, history) and resumes from it bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, Attack, AttackFailed, AttackResult, MatchSettings
from gradinv.attacks.matching import cosine_distances, total_variation
from gradinv.attacks.restarts import (
    Layout,
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


@ATTACKS.register("inverting_gradients")
class InvertingGradients(Attack):
    @dataclass(frozen=True)
    class Settings(MatchSettings):
        iterations: int = bounded(24_000, ge=1)
        lr: float = bounded(0.1, gt=0.0)
        tv: float = bounded(1e-4, ge=0.0, doc="weight of the total-variation prior")
        restarts: int = bounded(4, ge=1)
        signed: bool = True
        boxed: bool = True
        nonzero_only: bool = False
        log_every: int = bounded(25, ge=1)
        restarts_layout: Layout = "auto"
        output: Literal["best", "last"] = "best"

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
        distances = partial(cosine_distances, nonzero_only=s.nonzero_only)
        match = self.gradient_match(update, [n for n, _ in named], target, distances)
        layout = resolve_layout(s.restarts_layout, model, device, s.restarts)

        def no_aux(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            loss = F.cross_entropy(logits, labels)
            return loss, loss.new_zeros(())

        gradients = restart_gradients(model, named, no_aux, layout)

        mean = torch.tensor(meta.mean, device=device).view(1, 1, -1, 1, 1)
        std = torch.tensor(meta.std, device=device).view(1, 1, -1, 1, 1)
        low, high = (0 - mean) / std, (1 - mean) / std

        shape = (meta.batch_size, *meta.image_shape)
        x = initial_dummies(s.restarts, shape, generator, device).requires_grad_(True)
        opt = torch.optim.Adam([x], lr=s.lr)
        milestones = [int(s.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        history: dict[str, list[tuple[int, float]]] = {}
        start, saved = 0, progress.load() if progress else None
        if saved is not None:
            start, history = resume_loop(saved, x, opt, sched, generator)
            progress.resumed(f"iteration {start}")

        for it in self.iterations(f"IG, {s.restarts} restart(s) {layout}", start, s.iterations):
            opt.zero_grad()
            rec = match(gradients(x, True)[0], generator)
            objective = rec + s.tv * torch.stack([total_variation(xr) for xr in x])
            total = objective.sum()
            if not torch.isfinite(total):
                bad = [r for r, v in enumerate(objective.tolist()) if not math.isfinite(v)]
                raise AttackFailed(f"non-finite attack loss at restart {bad}, iteration {it}")
            (x.grad,) = torch.autograd.grad(total, x)
            if s.signed:
                x.grad.sign_()
            opt.step()
            sched.step()
            if s.boxed:
                with torch.no_grad():
                    x.data = torch.max(torch.min(x, high), low)
            if it % s.log_every == 0 or it == s.iterations - 1:
                log_restarts(history, it, objective)
            if progress and progress.due():
                progress.save(loop_state(it + 1, x, opt, sched, generator, history))

        final = x.detach()
        distances_final = match(gradients(final, False)[0], generator).tolist()
        history["final_gradient_distance"] = list(enumerate(distances_final))
        best, chosen = choose_restart(distances_final, s.output)
        images = denormalize(final[chosen].cpu(), meta.mean, meta.std).clamp(0, 1)
        return AttackResult(
            images=images,
            labels=labels.cpu(),
            history=history,
            summary={
                "best_restart": best,
                "returned_restart": chosen,
                "gradient_distance": distances_final[best],
                "returned_gradient_distance": distances_final[chosen],
                "restarts_layout": layout,
            },
        )
