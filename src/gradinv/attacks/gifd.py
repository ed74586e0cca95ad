"""GIFD, Generative Gradient Inversion via Feature Domain optimization (Fang et al., ICCV 2023,
arXiv:2308.04699); CENSOR's strongest attack.

Threat model: honest-but-curious server with a generator of the victim's domain, labels inferred
and fed to a class-conditional generator. GIFD searches the generator layer by layer:

- stage 0 optimises the latent (kept on its sphere, ``spherical``);
- stage k optimises the input of block k, the previous stage's result passed through block
  k - 1, projected after every step into an L1 ball of radius ``radii[k]`` around where the
  stage started, so that the features stay near the generator's range;
- a generator with a searched context (StyleGAN2: its W+ latent and first noise maps) optimises
  those too, on their spheres and in the same L1 ball. StyleGAN2's block input carries the RGB
  skip image beside the features (:mod:`gradinv.generators.stylegan2`), so it is searched with
  them; the GIFD code restarts the skip image from nothing at each stage.

Adam with the GIFD code's schedule (5% linear ramp-up, cosine ramp-down over the last 75%), loss
= gradient distance + TV + image norm. After every stage each restart's image is scored by its
gradient distance; the attack returns the best stage's best restart. The GIFD code returns the
*last* restart's image of the best stage while reporting the best score (``choose_optimal``);
``output: last`` reproduces that. All restarts run stacked, through one generator pass and one
batched gradient pass per step.

GIFD's full-scale setting (``workflow/configs/paper.yaml``): BigGAN-deep-256, 13 stages of 1000
steps, lr 0.1, radii 1000, 2000, 2500, ... 7500; StyleGAN2-FFHQ, 8 stages, radii 1000 ... 8000;
4 restarts, cosine distance, TV 1e-4, image norm 1e-6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, AttackFailed, AttackResult
from gradinv.attacks.generative import GenerativeAttack, PriorSettings
from gradinv.attacks.matching import total_variation
from gradinv.attacks.restarts import choose_restart
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate
from gradinv.settings import bounded

FEATURE = "feature"  # the variable of stage k > 0: the input of block k


def gifd_lr(t: float, lr: float, rampdown: float = 0.75, rampup: float = 0.05) -> float:
    """The GIFD code's learning rate at fraction ``t`` of a stage (``get_lr``)."""
    ramp = min(1.0, (1 - t) / rampdown)
    ramp = 0.5 - 0.5 * math.cos(ramp * math.pi)
    return lr * ramp * min(1.0, t / rampup)


def project_l1_ball(v: Tensor, radius: float) -> Tensor:
    """Each row of ``v`` (first dimension) projected onto the L1 ball of ``radius`` (Duchi et
    al., ICML 2008: sort, then soft-threshold at the level that meets the radius)."""
    flat = v.reshape(v.shape[0], -1)
    inside = flat.abs().sum(1) <= radius
    mags, _ = flat.abs().sort(dim=1, descending=True)
    cumulative = mags.cumsum(1)
    index = torch.arange(1, flat.shape[1] + 1, device=v.device, dtype=v.dtype)
    rho = (mags * index > cumulative - radius).to(v.dtype).mul(index).argmax(1)
    theta = (cumulative.gather(1, rho[:, None]) - radius) / (rho[:, None] + 1).to(v.dtype)
    projected = flat.sign() * (flat.abs() - theta).clamp_min(0)
    return torch.where(inside[:, None], flat, projected).reshape(v.shape)


def sphere_norm(t: Tensor) -> Tensor:
    """The norm GIFD's SphericalOptimizer keeps: per row over the last dimensions (per image and
    W+ row for a (N, 18, 512) latent, per image and map for (N, 1, H, W) noise), per image for a
    (N, d) latent."""
    dims = tuple(range(2, t.ndim)) if t.ndim >= 3 else (1,)
    return t.pow(2).sum(dims, keepdim=True).add(1e-9).sqrt()


@ATTACKS.register("gifd")
class GIFD(GenerativeAttack):
    @dataclass(frozen=True)
    class Settings(PriorSettings):
        iterations: int = bounded(1000, ge=1, doc="Adam steps per stage")
        stages: int = bounded(0, ge=0, doc="0: every block's input but the last block's")
        lr: float = bounded(0.1, gt=0.0)
        radii: tuple[float, ...] = (
            1000.0,
            2000.0,
            2500.0,
            3000.0,
            3500.0,
            4000.0,
            4500.0,
            5000.0,
            5500.0,
            6000.0,
            6500.0,
            7000.0,
            7500.0,
        )
        spherical: bool = True
        tv: float = bounded(1e-4, ge=0.0)
        image_norm: float = bounded(1e-6, ge=0.0)
        distance: Literal["cosine", "l2"] = "cosine"
        restarts: int = bounded(4, ge=1)

    @classmethod
    def budget(cls, settings: Settings) -> str:
        stages = settings.stages or "all"
        return f"{settings.restarts} restart(s) x {stages} stages x {settings.iterations} steps"

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        s = self.settings
        prior = self.prior(server, update, s.restarts, generator, device)
        gen = prior.generator
        stages = s.stages or gen.num_blocks
        if stages > gen.num_blocks:
            raise AttackFailed(
                f"stages: {stages}, but the generator has only {gen.num_blocks} stages "
                f"(blocks 0..{gen.num_blocks - 1}); lower attacks.<name>.stages"
            )
        classes = prior.classes_for(s.restarts)
        z = torch.cat([gen.sample_latent(prior.batch, generator) for _ in range(s.restarts)])
        ctx = {k: v.detach() for k, v in prior.context(z.to(device), classes).items()}
        h: Tensor | None = None
        history: dict[str, list[tuple[int, float]]] = {}
        scores: list[list[float]] = []  # per stage, each restart's gradient distance
        images: list[Tensor] = []  # per stage, (R, B, C, H, W) in [0, 1]
        stage, first, opt_state = 0, 0, None
        saved = progress.load() if progress else None
        if saved is not None:
            stage, first, ctx, h = saved["stage"], saved["iteration"], saved["ctx"], saved["h"]
            ctx = {k: v.to(device) for k, v in ctx.items()}
            h = None if h is None else h.to(device)
            history, scores, images = saved["history"], saved["scores"], saved["images"]
            opt_state = saved["optimizer"]
            generator.set_state(saved["generator"])
            progress.resumed(f"stage {stage}, iteration {first}")

        while stage < stages:
            names = [n for n in gen.searched_context(stage) if n in ctx]
            if stage == 0 and "latent" not in names:
                names = ["latent", *names]
            variables = {n: ctx[n].clone().requires_grad_(True) for n in names}
            if stage > 0:
                variables[FEATURE] = h.clone().requires_grad_(True)
            if saved is not None and opt_state is not None:
                for n, v in saved["variables"].items():
                    variables[n] = v.to(device).requires_grad_(True)
            origin = {
                n: (saved["origin"][n].to(device) if saved is not None else v.detach())
                for n, v in variables.items()
            }
            searched = gen.searched_context(stage)
            projected_l1 = [n for n in variables if n == FEATURE or n in searched]
            spheres = {
                n: sphere_norm(origin[n])
                for n in variables
                if s.spherical and n != FEATURE and gen.spherical(n)
            }
            radius = s.radii[min(stage, len(s.radii) - 1)] if s.radii else 0.0
            opt = torch.optim.Adam(list(variables.values()), lr=s.lr)
            if opt_state is not None:
                opt.load_state_dict(opt_state)
            opt_state, saved = None, None

            def render(v: dict[str, Tensor], c: dict[str, Tensor] = ctx, k: int = stage) -> Tensor:
                c = {**c, **{n: t for n, t in v.items() if n != FEATURE}}
                start = v[FEATURE] if k > 0 else gen.head(c)
                return gen.synthesize(start, c, k)

            desc = f"GIFD stage {stage}, {s.restarts} restart(s) {prior.layout}"
            for it in self.iterations(desc, first, s.iterations):
                opt.param_groups[0]["lr"] = gifd_lr(it / s.iterations, s.lr)
                opt.zero_grad()
                x = prior.model_input(render(variables))
                rec = prior.match(prior.gradients(x, True)[0], generator)
                objective = rec + torch.stack(
                    [
                        s.tv * total_variation(xr) + s.image_norm * xr.norm() / xr[0, 0].numel()
                        for xr in x
                    ]
                )
                if not torch.isfinite(objective).all():
                    raise AttackFailed(f"non-finite GIFD loss at stage {stage}, iteration {it}")
                objective.sum().backward()
                opt.step()
                with torch.no_grad():
                    for n, norm in spheres.items():
                        variables[n].mul_(norm / sphere_norm(variables[n]))
                    if radius > 0:
                        for n in projected_l1:
                            deviation = project_l1_ball(variables[n] - origin[n], radius)
                            variables[n].copy_(origin[n] + deviation)
                if it % s.log_every == 0 or it == s.iterations - 1:
                    for r, value in enumerate(objective.tolist()):
                        history.setdefault(f"loss_restart{r}", []).append(
                            (stage * s.iterations + it, value)
                        )
                if progress and progress.due():
                    progress.save(
                        _state(
                            stage,
                            it + 1,
                            ctx,
                            h,
                            variables,
                            origin,
                            opt,
                            generator,
                            history,
                            scores,
                            images,
                        )
                    )
            with torch.no_grad():
                generated = render(variables)
                scores.append(prior.distances(generated, generator, create_graph=False).tolist())
                images.append(prior.images(generated).reshape(s.restarts, *prior.shape))
                history.setdefault("stage_best_distance", []).append((stage, min(scores[-1])))
                ctx = {**ctx, **{n: v.detach() for n, v in variables.items() if n != FEATURE}}
                start = variables[FEATURE].detach() if stage > 0 else gen.head(ctx)
                h = gen.block(stage, start, ctx) if stage < gen.num_blocks else None
            stage, first = stage + 1, 0

        best_stage = min(range(len(scores)), key=lambda k: min(scores[k]))
        best, chosen = choose_restart(scores[best_stage], s.output)
        history["final_gradient_distance"] = list(enumerate(scores[best_stage]))
        return AttackResult(
            images=images[best_stage][chosen],
            labels=prior.labels.cpu(),
            history=history,
            summary={
                "best_stage": best_stage,
                "stage_distances": [min(v) for v in scores],
                "best_restart": best,
                "returned_restart": chosen,
                "gradient_distance": scores[best_stage][best],
                "returned_gradient_distance": scores[best_stage][chosen],
                "restarts_layout": prior.layout,
            },
        )


def _state(
    stage: int,
    iteration: int,
    ctx: dict[str, Tensor],
    h: Tensor | None,
    variables: dict[str, Tensor],
    origin: dict[str, Tensor],
    opt: torch.optim.Optimizer,
    generator: torch.Generator,
    *rest: Any,
) -> dict[str, Any]:
    history, scores, images = rest
    cpu = {n: v.detach().cpu() for n, v in ctx.items()}
    return {
        "stage": stage,
        "iteration": iteration,
        "ctx": cpu,
        "h": None if h is None else h.cpu(),
        "variables": {n: v.detach().cpu() for n, v in variables.items()},
        "origin": {n: v.cpu() for n, v in origin.items()},
        "optimizer": opt.state_dict(),
        "generator": generator.get_state(),
        "history": history,
        "scores": scores,
        "images": images,
    }
