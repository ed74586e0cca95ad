"""GIAS, Gradient Inversion with a generative image prior (Jeon et al., NeurIPS 2021,
arXiv:2110.14962).

Threat model: honest-but-curious server with a generator of the victim's domain, labels inferred
and fed to a class-conditional generator. Two stages, both Adam with step decay (x0.1 at 3/8,
5/8, 7/8 of the stage), loss = gradient distance + TV:

1. latent search: the latent of every image, through the frozen generator;
2. parameter search: each image gets its own copy of the generator, whose weights are then
   optimised with its latent fixed, so that the image can leave the generator's range where the
   gradient asks for it.

All restarts and images run stacked: stage 1 through one generator pass, stage 2 through one
``vmap`` over the R x B generator copies (each copy its own weights, ``torch.func``).

Paper and the GIFD/CENSOR code (which CENSOR runs) differ; each is a setting:

- ``param_start``: ``own``: each restart tunes the generator copies of its own latent (the
  paper's restarts); ``best``: every restart starts stage 2 from the latent of the restart that
  matched best after stage 1, as the GIFD code does;
- ``output``: ``best`` restart, or ``last`` as GIFD's ``choose_optimal``;
- iterations and learning rates: GIFD's harness runs 1000 latent steps at 0.03 and 8000
  parameter steps at 1e-5 (BigGAN) or 1e-3 (StyleGAN2). BigGAN's spectral norm is baked into
  plain weights here, while the GIFD code tunes the weights before the normalisation: the same
  ``param_lr`` moves BigGAN's effective weights by lr here, by lr / sigma (each layer's spectral
  norm) there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, AttackFailed, AttackResult
from gradinv.attacks.generative import GenerativeAttack, PriorSettings
from gradinv.attacks.matching import total_variation
from gradinv.attacks.restarts import choose_restart
from gradinv.generators import Generator
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate
from gradinv.settings import bounded


class _Render(nn.Module):
    """A generator's image from its context, as a module ``functional_call`` can re-weight."""

    def __init__(self, generator: Generator) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, ctx: dict[str, Tensor]) -> Tensor:
        g = self.generator
        return g.synthesize(g.head(ctx), ctx, 0)


def step_schedule(opt: torch.optim.Optimizer, iterations: int) -> Any:
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)


@ATTACKS.register("gias")
class GIAS(GenerativeAttack):
    @dataclass(frozen=True)
    class Settings(PriorSettings):
        latent_iterations: int = bounded(1000, ge=1)
        latent_lr: float = bounded(0.03, gt=0.0)
        param_iterations: int = bounded(8000, ge=0, doc="0: latent search only")
        param_lr: float = bounded(1e-3, gt=0.0)
        tv: float = bounded(1e-4, ge=0.0)
        distance: Literal["cosine", "l2"] = "cosine"
        restarts: int = bounded(4, ge=1)
        param_start: Literal["own", "best"] = "own"

    @classmethod
    def budget(cls, settings: Settings) -> str:
        return (
            f"{settings.restarts} restart(s) x ({settings.latent_iterations} latent + "
            f"{settings.param_iterations} weight steps)"
        )

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
        gen, batch = prior.generator, prior.batch
        classes = prior.classes_for(s.restarts)
        z = torch.cat([gen.sample_latent(batch, generator) for _ in range(s.restarts)])
        ctx = {k: v.detach() for k, v in prior.context(z.to(device), classes).items()}
        history: dict[str, list[tuple[int, float]]] = {}

        def objective(generated: Tensor, it: int, offset: int) -> Tensor:
            x = prior.model_input(generated)
            rec = prior.match(prior.gradients(x, True)[0], generator)
            value = rec + s.tv * torch.stack([total_variation(xr) for xr in x])
            if not torch.isfinite(value).all():
                raise AttackFailed(f"non-finite GIAS loss at iteration {offset + it}")
            if it % s.log_every == 0:
                for r, v in enumerate(value.tolist()):
                    history.setdefault(f"loss_restart{r}", []).append((offset + it, v))
            return value

        # Stage 1: the latents, through the frozen generator.
        latent = ctx["latent"].clone().requires_grad_(True)
        opt = torch.optim.Adam([latent], lr=s.latent_lr)
        sched = step_schedule(opt, s.latent_iterations)
        start, saved = 0, progress.load() if progress else None
        if saved is not None and saved["stage"] == 1:
            start, history = saved["iteration"], saved["history"]
            with torch.no_grad():
                latent.copy_(saved["latent"])
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            generator.set_state(saved["generator"])
            progress.resumed(f"latent search, iteration {start}")
        if saved is None or saved["stage"] == 1:
            desc = f"GIAS latents, {s.restarts} restart(s) {prior.layout}"
            for it in self.iterations(desc, start, s.latent_iterations):
                opt.zero_grad()
                objective(_render(gen, {**ctx, "latent": latent}), it, 0).sum().backward()
                opt.step()
                sched.step()
                if progress and progress.due():
                    progress.save(
                        {
                            "stage": 1,
                            "iteration": it + 1,
                            "latent": latent.detach().cpu(),
                            "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(),
                            "generator": generator.get_state(),
                            "history": history,
                        }
                    )
        ctx = {**ctx, "latent": latent.detach()}
        with torch.no_grad():
            generated = _render(gen, ctx)
            latent_scores = prior.distances(generated, generator, create_graph=False).tolist()
        if saved is not None and saved["stage"] == 2:
            latent_scores = saved["latent_scores"]
        history["latent_gradient_distance"] = list(enumerate(latent_scores))
        if s.param_start == "best":  # the GIFD code: every restart from the best latent
            best = min(range(s.restarts), key=latent_scores.__getitem__)
            ctx = {
                k: v.reshape(s.restarts, batch, *v.shape[1:])[best].repeat(
                    s.restarts, *[1] * (v.ndim - 1)
                )
                for k, v in ctx.items()
            }

        # Stage 2: one generator copy per image and restart, its weights optimised.
        if s.param_iterations > 0:
            render = _Render(gen)
            buffers = dict(render.named_buffers())
            copies = s.restarts * batch
            weights = {
                n: p.detach().expand(copies, *p.shape).clone().requires_grad_(True)
                for n, p in render.named_parameters()
            }

            def one(w: dict[str, Tensor], c: dict[str, Tensor]) -> Tensor:
                rows = {k: v[None] for k, v in c.items()}
                return functional_call(render, (w, buffers), (rows,))[0]

            per_copy = vmap(one, in_dims=(0, 0), randomness="different")
            opt = torch.optim.Adam(list(weights.values()), lr=s.param_lr)
            sched = step_schedule(opt, s.param_iterations)
            start = 0
            if saved is not None and saved["stage"] == 2:
                start, history = saved["iteration"], saved["history"]
                with torch.no_grad():
                    for n, w in weights.items():
                        w.copy_(saved["weights"][n])
                ctx = {k: v.to(device) for k, v in saved["ctx"].items()}
                opt.load_state_dict(saved["optimizer"])
                sched.load_state_dict(saved["scheduler"])
                generator.set_state(saved["generator"])
                progress.resumed(f"parameter search, iteration {start}")
            desc = f"GIAS generator copies, {copies} copies batched"
            for it in self.iterations(desc, start, s.param_iterations):
                opt.zero_grad()
                objective(per_copy(weights, ctx), it, s.latent_iterations).sum().backward()
                opt.step()
                sched.step()
                if progress and progress.due():
                    progress.save(
                        {
                            "stage": 2,
                            "iteration": it + 1,
                            "ctx": {k: v.cpu() for k, v in ctx.items()},
                            "weights": {n: w.detach().cpu() for n, w in weights.items()},
                            "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(),
                            "generator": generator.get_state(),
                            "history": history,
                            "latent_scores": latent_scores,
                        }
                    )
            with torch.no_grad():
                generated = per_copy(weights, ctx)
        with torch.no_grad():
            final = prior.distances(generated, generator, create_graph=False).tolist()
        history["final_gradient_distance"] = list(enumerate(final))
        best, chosen = choose_restart(final, s.output)
        return AttackResult(
            images=prior.images(generated).reshape(s.restarts, *prior.shape)[chosen],
            labels=prior.labels.cpu(),
            history=history,
            summary={
                "best_restart": best,
                "returned_restart": chosen,
                "gradient_distance": final[best],
                "returned_gradient_distance": final[chosen],
                "latent_gradient_distance": min(latent_scores),
                "restarts_layout": prior.layout,
            },
        )


def _render(gen: Generator, ctx: dict[str, Tensor]) -> Tensor:
    return gen.synthesize(gen.head(ctx), ctx, 0)
