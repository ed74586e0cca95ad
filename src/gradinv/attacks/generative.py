"""What the generative-prior attacks (GGL, GIAS, GIFD) share: a generator, and candidates
scored in one batched pass.

These attacks search a generator's latent space (and GIAS its weights, GIFD its intermediate
features) instead of pixels, so every candidate is a natural image of the generator's domain. The
stage hands the attack its generator (:meth:`GenerativeAttack.use_generator`): one trained on
the attacker's public split at the embedded scale, published weights at full scale. The victim's
inferred labels condition a class-conditional generator, through ``label_map`` where the
generator's classes are not the dataset's (CIFAR-10 onto BigGAN's ImageNet classes).

A :class:`Prior` turns generator outputs (N, C, h, w) in [-1, 1] into the FL model's input
(area-resized to the attacked side, as the GGL and GIFD code do, then normalised) and scores
stacked candidates, R of them at once: their parameter gradients in one ``vmap`` pass or a loop
(:mod:`gradinv.attacks.restarts`), compared with the shared update through the defense's view
(:class:`~gradinv.attacks.base.GradientMatch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from gradinv.attacks.base import CPU, Attack, AttackFailed, GradientMatch, MatchSettings
from gradinv.attacks.matching import cosine_distances, euclidean_distances
from gradinv.attacks.restarts import Layout, RestartGradients, resolve_layout, restart_gradients
from gradinv.generators import Generator
from gradinv.protocol import ServerMessage, SharedUpdate
from gradinv.settings import bounded


@dataclass(frozen=True)
class PriorSettings(MatchSettings):
    """Settings every generative-prior attack has besides the matching ones."""

    generator: str = ""  # a generators.<name>; empty: the one that serves the attacked dataset
    output: Literal["best", "last"] = "best"  # restart returned (last: the GIFD code's)
    restarts_layout: Layout = "auto"  # candidates' gradients: one vmap pass, or a loop
    log_every: int = bounded(25, ge=1)


def layer_mean_l2(samples: list[Tensor], target: list[Tensor]) -> Tensor:
    """GGL's loss: the squared L2 distance of each layer's gradient, averaged over layers."""
    return euclidean_distances(samples, target) / len(target)


DISTANCES: dict[str, Callable[[list[Tensor], list[Tensor]], Tensor]] = {
    "cosine": cosine_distances,
    "l2": layer_mean_l2,
}


@dataclass
class Prior:
    """One attack run's problem: the generator and the labels that condition it, and how stacked
    candidate images are scored against the shared update."""

    generator: Generator
    labels: Tensor  # (B,) the victim's labels as the attack uses them (inferred or known)
    classes: Tensor | None  # (B,) the generator's classes for them; None: unconditional
    match: GradientMatch
    gradients: RestartGradients
    layout: str
    shape: tuple[int, ...]  # (B, C, H, W) of the victim's batch
    mean: Tensor
    std: Tensor
    noise_seed: int  # the generator's random inputs (StyleGAN2's noise maps) stay fixed

    def generate(self, z: Tensor, classes: Tensor | None) -> Tensor:
        """The generator's images of latents ``z`` (N, ...), with the run's fixed noise."""
        return self.generator(z, classes, torch.Generator().manual_seed(self.noise_seed))

    def context(self, z: Tensor, classes: Tensor | None) -> dict[str, Tensor]:
        """The generator's context of ``z``, with the run's fixed noise."""
        return self.generator.context(z, classes, torch.Generator().manual_seed(self.noise_seed))

    @property
    def batch(self) -> int:
        return self.shape[0]

    def classes_for(self, copies: int) -> Tensor | None:
        """The generator classes of ``copies`` stacked batches (restart-major)."""
        return None if self.classes is None else self.classes.repeat(copies)

    def unit(self, generated: Tensor) -> Tensor:
        """Generator outputs (N, c, h, w) in [-1, 1] -> the attacked (N, C, H, W), [0, 1]."""
        _, channels, height, width = self.shape
        x = (generated + 1) / 2
        if x.shape[-2:] != (height, width):
            mode = "area" if x.shape[-1] > width else "bilinear"
            x = F.interpolate(x, size=(height, width), mode=mode)
        if x.shape[1] != channels:
            x = x.mean(1, keepdim=True).expand(-1, channels, -1, -1)
        return x

    def model_input(self, generated: Tensor) -> Tensor:
        """Generator outputs (R·B, ...) -> the FL model's normalised input (R, B, C, H, W)."""
        x = (self.unit(generated) - self.mean) / self.std
        return x.reshape(-1, *self.shape)

    def distances(self, generated: Tensor, rng: torch.Generator, create_graph: bool) -> Tensor:
        """The gradient distance of each of the R stacked candidate batches: (R,)."""
        return self.match(self.gradients(self.model_input(generated), create_graph)[0], rng)

    def images(self, generated: Tensor) -> Tensor:
        """One candidate batch (B, ...) as the reconstruction: [0, 1], on the CPU."""
        return self.unit(generated).clamp(0, 1).detach().cpu()


class GenerativeAttack(Attack):
    """An attack that searches a generator. The stage calls :meth:`use_generator` first."""

    generative: ClassVar[bool] = True

    def __init__(self, settings: Any, threat: Any) -> None:
        super().__init__(settings, threat)
        self.generator: Generator | None = None
        self.label_map: list[int] | None = None

    def use_generator(self, generator: Generator, label_map: list[int] | None = None) -> None:
        """The generator to search, and the generator class of each dataset label (None: the
        same index)."""
        self.generator, self.label_map = generator, label_map

    def prior(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        candidates: int,
        rng: torch.Generator,
        device: torch.device = CPU,
    ) -> Prior:
        """Set up a run: the attacker's model, the labels, and a scorer of ``candidates`` stacked
        batches (restarts, or population members times restarts)."""
        if self.generator is None:
            raise AttackFailed(f"{type(self).__name__} was given no generator (use_generator)")
        s, meta = self.settings, update.meta
        model, named, target = self.match_target(server, update, device)
        labels = self.private_labels(model, update).to(device)
        match = self.gradient_match(update, [n for n, _ in named], target, DISTANCES[s.distance])
        layout = resolve_layout(s.restarts_layout, model, device, candidates)

        def loss_of(logits: Tensor) -> tuple[Tensor, Tensor]:
            loss = F.cross_entropy(logits, labels)
            return loss, loss.new_zeros(())

        gen = self.generator.to(device)
        classes = None
        if gen.num_classes:
            if self.label_map is None and meta.num_classes != gen.num_classes:
                raise AttackFailed(
                    f"the dataset has {meta.num_classes} classes, the generator "
                    f"{gen.num_classes}: say which generator class each label is "
                    "(generators.<name>.label_map)"
                )
            classes = labels
            if self.label_map is not None:
                classes = torch.tensor(self.label_map, device=device)[labels]
            if int(classes.max()) >= gen.num_classes:
                raise AttackFailed(
                    f"label(s) {classes.tolist()} are not classes of the generator "
                    f"({gen.num_classes} classes); give generators.<name>.label_map"
                )
        channels = meta.image_shape[0]
        return Prior(
            generator=gen,
            labels=labels,
            classes=classes,
            match=match,
            gradients=restart_gradients(model, named, loss_of, layout),
            layout=layout,
            shape=(meta.batch_size, *meta.image_shape),
            mean=torch.tensor(meta.mean, device=device).view(1, channels, 1, 1),
            std=torch.tensor(meta.std, device=device).view(1, channels, 1, 1),
            noise_seed=int(torch.randint(1, 2**31 - 1, (1,), generator=rng)),
        )
