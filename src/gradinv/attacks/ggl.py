"""GGL, Generative Gradient Leakage (Li et al., CVPR 2022, arXiv:2203.15696).

Threat model: honest-but-curious server with a generator of the victim's domain; labels inferred
(iDLG-style) and fed to a class-conditional generator. The attack never differentiates through
the generator: CMA-ES (the ``cma`` library, Hansen's reference implementation, which nevergrad's
``CMA`` wraps) searches the latent space, each candidate scored by the distance between the
gradient of its generated image and the shared update. The latent passes through ``tanh``
(``squash``), which keeps it in a box the generator was trained on.

CMA-ES draws from numpy's global generator, seeded per restart by the attack's seed; a resumed
run rebuilds each CMA-ES by replaying the losses it was told (no pickled state). Each generation
asks ``population`` latents of every restart's CMA-ES; all population members of
all restarts are generated and scored in one batched pass (one generator forward, the FL model's
per-candidate gradients in one ``vmap``). After ``budget`` generations each restart returns the
best latent it evaluated (nevergrad's recommendation for a deterministic loss), and the attack
the restart whose image matches best (``output: best``; ``last`` as the GIFD code).

Paper, GGL code and GIFD/CENSOR code differ; each is a setting:

- ``distance``: ``l2`` (GGL: squared L2 per layer, averaged over layers) or ``cosine``;
- ``init``: ``uniform`` [0, 1) as GGL's ``np.random.rand``, ``normal`` as the GIFD code;
- ``kl``: GIFD's regulariser, ``kl`` times the KL divergence of the latent's empirical mean and
  std from N(0, 1) (0.1 in the GIFD/CENSOR code, off in GGL where tanh is on);
- ``budget`` x ``population``: GGL's README 500 x 50 (nevergrad asks 50 candidates a round from a
  CMA of population 18; here the CMA population *is* ``population``), GIFD's 800 x 50 x 4
  restarts;
- ``transform_aware``: GGL's adaptive attack passes the dummy gradient through the defense's
  transform with parameters estimated from the shared update (``estimated``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, AttackFailed, AttackResult
from gradinv.attacks.generative import GenerativeAttack, PriorSettings
from gradinv.attacks.restarts import choose_restart
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate
from gradinv.settings import bounded


def kl_to_standard_normal(z: Tensor) -> Tensor:
    """Per row of ``z`` (N, d): KL(N(mean, std^2) || N(0, 1)) of its entries' empirical mean
    and std, as the GIFD code's KLD term (population std)."""
    mean, var = z.mean(-1), z.var(-1, unbiased=False)
    return -0.5 * (1 + torch.log(var + 1e-10) - mean.pow(2) - var)


@ATTACKS.register("ggl")
class GGL(GenerativeAttack):
    @dataclass(frozen=True)
    class Settings(PriorSettings):
        budget: int = bounded(500, ge=1, doc="CMA-ES generations")
        population: int = bounded(50, ge=2, doc="candidates per generation and restart")
        sigma: float = bounded(1.0, gt=0.0, doc="CMA-ES initial step size")
        restarts: int = bounded(1, ge=1)
        init: Literal["normal", "uniform"] = "normal"
        squash: bool = True  # tanh on the latent
        kl: float = bounded(0.0, ge=0.0, doc="weight of the latent's KL term (GIFD code: 0.1)")
        distance: Literal["l2", "cosine"] = "l2"

    @classmethod
    def budget(cls, settings: Settings) -> str:
        return (
            f"{settings.restarts} restart(s) x {settings.budget} CMA-ES generations of "
            f"{settings.population}"
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
        prior = self.prior(server, update, s.population * s.restarts, generator, device)
        gen, batch = prior.generator, prior.batch
        latent_shape = (batch, *gen.latent_shape)
        dim = math.prod(latent_shape)
        classes = prior.classes_for(s.population * s.restarts)

        def latents(flat: np.ndarray) -> tuple[Tensor, Tensor]:
            """(candidates, dim) search points -> the generator's latents, and the raw ones."""
            raw = torch.as_tensor(flat, dtype=torch.float32, device=device)
            z = torch.tanh(raw) if s.squash else raw
            return z.reshape(-1, *gen.latent_shape), raw.reshape(-1, batch, raw.shape[-1] // batch)

        def losses(flat: np.ndarray, cls: Tensor | None) -> Tensor:
            z, raw = latents(flat)
            with torch.no_grad():
                images = prior.generate(z, cls)
                loss = prior.distances(images, generator, create_graph=False)
            if s.kl > 0:
                loss = loss + s.kl * kl_to_standard_normal(raw).sum(-1)
            return loss

        history: dict[str, list[tuple[int, float]]] = {}
        saved = progress.load() if progress else None
        if saved is None:
            draw = torch.rand if s.init == "uniform" else torch.randn
            starts = torch.stack([draw(dim, generator=generator) for _ in range(s.restarts)])
            seeds = torch.randint(1, 2**31 - 1, (s.restarts,), generator=generator)
            told: list[np.ndarray] = []
        else:
            starts, seeds, history = saved["starts"], saved["seeds"], saved["history"]
            told = list(saved["told"].numpy())
        import cma  # on use: it imports scipy.stats, seconds for every job that never runs GGL

        options = {"popsize": s.population, "verbose": -9}
        strategies = [
            cma.CMAEvolutionStrategy(x0.double().numpy(), s.sigma, {**options, "seed": int(seed)})
            for x0, seed in zip(starts, seeds, strict=True)
        ]
        for values in told:  # a resumed run replays what it told CMA-ES: the same state
            for es, value in zip(strategies, values, strict=True):
                es.tell(es.ask(), value.tolist())
        if saved is not None:
            generator.set_state(saved["generator"])
            progress.resumed(f"generation {len(told)}")
        start = len(told)

        desc = f"GGL, {s.restarts} restart(s) x {s.population} candidates {prior.layout}"
        for it in self.iterations(desc, start, s.budget):
            asked = [es.ask() for es in strategies]
            values = losses(np.concatenate([np.asarray(a) for a in asked]), classes)
            if not torch.isfinite(values).all():
                raise AttackFailed(f"non-finite GGL loss at generation {it}")
            per_restart = values.reshape(s.restarts, s.population).double().cpu().numpy()
            for es, points, value in zip(strategies, asked, per_restart, strict=True):
                es.tell(points, value.tolist())
            told.append(per_restart)
            if it % s.log_every == 0 or it == s.budget - 1:
                for r, es in enumerate(strategies):
                    history.setdefault(f"loss_restart{r}", []).append((it, float(es.result.fbest)))
            if progress and progress.due():
                progress.save(
                    {
                        "starts": starts,
                        "seeds": seeds,
                        "told": torch.from_numpy(np.stack(told)),
                        "generator": generator.get_state(),
                        "history": history,
                    }
                )

        best_points = np.stack([np.asarray(es.result.xbest) for es in strategies])
        z, _ = latents(best_points)
        with torch.no_grad():
            images = prior.generate(z, prior.classes_for(s.restarts))
            final = prior.distances(images, generator, create_graph=False).tolist()
        history["final_gradient_distance"] = list(enumerate(final))
        best, chosen = choose_restart(final, s.output)
        return AttackResult(
            images=prior.images(images.reshape(s.restarts, batch, *images.shape[1:])[chosen]),
            labels=prior.labels.cpu(),
            history=history,
            summary={
                "best_restart": best,
                "returned_restart": chosen,
                "gradient_distance": final[best],
                "returned_gradient_distance": final[chosen],
                "restarts_layout": prior.layout,
                "evaluations": sum(int(es.countevals) for es in strategies),
            },
        )
