"""A tiny generator for the attack tests, and each attack's settings for a few cheap steps."""

from __future__ import annotations

import functools

import numpy as np
import torch

from gradinv.attacks import ATTACKS, Attack
from gradinv.generators.dcgan import DCGAN, train_dcgan

# Settings that make each attack take a few cheap steps (an attack not listed: "iterations").
FEW = {
    "ggl": {"budget": 3, "population": 4},
    "gias": {"latent_iterations": 2, "param_iterations": 2},
    "gifd": {"iterations": 2, "radii": [0.0, 10.0, 20.0]},
    "imprint": {},  # analytic: one pass, no iterations
}


def few(kind: str, **extra: object) -> dict:
    return {**FEW.get(kind, {"iterations": 3}), **extra}


@functools.cache
def tiny_generator(side: int = 16) -> DCGAN:
    """A class-conditional DCGAN of side ``side`` with seeded random weights, frozen."""
    torch.manual_seed(0)
    model = DCGAN.build(DCGAN.Settings(latent_dim=16, width=8), side, 3, 10).eval()
    return model.requires_grad_(False)


@functools.cache
def trained_generator() -> DCGAN:
    """A tiny DCGAN (16x16, 10 classes) trained for a few seconds on crops of scikit-image's
    photographs, class c = photograph c, the cat (test_attacks' victim) among them as class 2;
    the crops avoid the victim's patch (the public data of this tiny world)."""
    from skimage import data, transform

    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.camera()]
    images, labels = [], []
    gen = torch.Generator().manual_seed(0)
    for c, photo in enumerate(photos):
        if photo.ndim == 2:
            photo = np.stack([photo] * 3, -1)
        img = torch.tensor(transform.resize(photo, (64, 64), anti_aliasing=True)).float()
        img = img.permute(2, 0, 1)
        for _ in range(64):
            i, j = torch.randint(0, 49, (2,), generator=gen).tolist()
            if c == 2 and abs(i - 16) < 8 and abs(j - 16) < 8:
                continue  # the victim's patch is private
            images.append(img[:, i : i + 16, j : j + 16])
            labels.append(c)
    settings = DCGAN.Settings(latent_dim=16, width=16, steps=300, batch_size=32, log_every=1000)
    model, _ = train_dcgan(
        settings, torch.stack(images), torch.tensor(labels), 10, torch.Generator().manual_seed(0)
    )
    return model.requires_grad_(False)


def ready(attack: Attack, side: int = 16) -> Attack:
    """Give a generative-prior attack its generator (other attacks need nothing)."""
    if getattr(attack, "generative", False):
        attack.use_generator(tiny_generator(side))
    return attack


def is_generative(kind: str) -> bool:
    return getattr(ATTACKS.get(kind), "generative", False)
