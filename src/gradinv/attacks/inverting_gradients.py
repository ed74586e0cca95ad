"""Inverting Gradients (Geiping et al. 2020, arXiv:2003.14053).

Threat model: honest-but-curious server, one shared gradient, labels inferred (or known).
Optimise dummy images in the model's normalised input space to minimise the cosine distance
between their gradient and the shared one, plus a total-variation prior; Adam with step decay at
3/8, 5/8 and 7/8 of the iterations; pixels boxed to the valid range after every step; optionally
the sign of the image gradient (the paper's choice); R restarts, keeping the one whose final
gradient distance is lowest.

``eot_samples`` > 0 turns it into the adaptive attack of CENSOR's Table III (NDSS 2025, Section
V-D): the dummy gradient is matched through n CENSOR-style transforms, combined by
``eot_combine``, with CENSOR's ``eot_projection`` and ``eot_scope`` (see
:mod:`gradinv.attacks.eot`). The samples are drawn from the attack's generator, so a seed fixes
them and a resumed run draws the same ones; the final distance that picks the restart is the
same EOT loss on fresh samples. With ``eot_samples: 0`` (the default) the attack is unchanged.

With a :class:`~gradinv.progress.Progress` the loop saves its state (images, Adam and scheduler
state, generator, history) and resumes from it bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, Attack, AttackFailed, AttackResult, MatchSettings
from gradinv.attacks.eot import Combine, Projection, Scope, eot_distance
from gradinv.attacks.matching import cosine_distance, total_variation
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
        eot_samples: int = bounded(
            0, ge=0, doc="EOT against CENSOR: transformed dummy gradients per iteration; 0 = off"
        )
        eot_combine: Combine = "average-gradient"
        eot_projection: Projection = "exact"  # CENSOR's projection, to match the defense
        eot_scope: Scope = "layer-wise"  # CENSOR's scope, to match the defense

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
        params = [p for _, p in named]
        labels = self.private_labels(model, update).to(device)
        defended = self.dummy_transform(update, [n for n, _ in named], target)

        shape = (meta.batch_size, *meta.image_shape)
        mean = torch.tensor(meta.mean, device=device).view(1, -1, 1, 1)
        std = torch.tensor(meta.std, device=device).view(1, -1, 1, 1)
        low, high = (0 - mean) / std, (1 - mean) / std

        def match_loss(x: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(model(x), labels)
            dummy = defended(list(torch.autograd.grad(loss, params, create_graph=True)))
            if s.eot_samples:
                return eot_distance(
                    list(dummy),
                    target,
                    s.eot_samples,
                    generator,
                    combine=s.eot_combine,
                    projection=s.eot_projection,
                    scope=s.eot_scope,
                    nonzero_only=s.nonzero_only,
                )
            return cosine_distance(list(dummy), target, s.nonzero_only)

        best: tuple[float, int, torch.Tensor] | None = None
        history: dict[str, list[tuple[int, float]]] = {}
        milestones = [int(s.iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        first_restart, first_it, saved = 0, 0, progress.load() if progress else None
        if saved is not None:
            first_restart, first_it = saved["restart"], saved["iteration"]
            history, best = saved["history"], saved["best"]
            progress.resumed(f"restart {first_restart + 1}, iteration {first_it}")
        for restart in range(first_restart, s.restarts):
            x = torch.randn(shape, generator=generator).to(device).requires_grad_(True)
            opt = torch.optim.Adam([x], lr=s.lr)
            sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
            start = 0
            if saved is not None and restart == first_restart:
                with torch.no_grad():
                    x.copy_(saved["x"])
                opt.load_state_dict(saved["optimizer"])
                sched.load_state_dict(saved["scheduler"])
                generator.set_state(saved["generator"])
                start = first_it
            curve = history.setdefault(f"loss_restart{restart}", [])
            bar = tqdm(
                range(start, s.iterations),
                desc=f"IG restart {restart + 1}/{s.restarts}",
                mininterval=5.0,
                leave=False,
            )
            for it in bar:
                opt.zero_grad()
                rec = match_loss(x)
                objective = rec + s.tv * total_variation(x)
                if not torch.isfinite(objective):
                    raise AttackFailed(
                        f"non-finite attack loss at restart {restart}, iteration {it}"
                    )
                (x.grad,) = torch.autograd.grad(objective, x)
                if s.signed:
                    x.grad.sign_()
                opt.step()
                sched.step()
                if s.boxed:
                    with torch.no_grad():
                        x.data = torch.max(torch.min(x, high), low)
                if it % s.log_every == 0 or it == s.iterations - 1:
                    curve.append((it, objective.item()))
                if progress and progress.due():
                    progress.save(
                        {
                            "restart": restart,
                            "iteration": it + 1,
                            "x": x.detach().cpu(),
                            "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(),
                            "generator": generator.get_state(),
                            "history": history,
                            "best": best,
                        }
                    )
            final = match_loss(x.detach()).item()
            history.setdefault("final_gradient_distance", []).append((restart, final))
            if not torch.isfinite(torch.tensor(final)):
                raise AttackFailed(f"non-finite final gradient distance at restart {restart}")
            if best is None or final < best[0]:
                best = (final, restart, x.detach().cpu().clone())

        assert best is not None
        images = denormalize(best[2], meta.mean, meta.std).clamp(0, 1)
        return AttackResult(
            images=images,
            labels=labels.cpu(),
            history=history,
            summary={"best_restart": best[1], "gradient_distance": best[0]},
        )
