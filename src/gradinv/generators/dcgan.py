"""A class-conditional DCGAN the pipeline trains on the attacker's public split.

The generative-prior attacks need a generator of the attacked domain. At full scale that is a
pretrained BigGAN or StyleGAN2; at the embedded scale nothing pretrained exists, so the attacker
trains one, as Refiner's authors did for GGL (a DCGAN on public data): rule ``train_generator``,
on the public split of ``partition.public_fraction`` (train images no client holds; the victims
are validation images).

Generator: DCGAN (Radford et al. 2016, arXiv:1511.06434): z and a learned class embedding,
projected to a 4x4 map, then one stride-2 transposed convolution (BatchNorm, ReLU) per doubling
of the side, a 3x3 convolution to RGB and tanh. Conditional, because the attacks infer the
victim's label from the gradient and a class-conditional generator turns it into a prior of that
class (as BigGAN does in GGL and GIFD).

Discriminator and loss: a spectrally normalised convolutional projection discriminator (Miyato &
Koyama 2018, arXiv:1802.05637) with the hinge loss, which trains stably on a small public split;
the generator's weights are an exponential moving average of its training weights.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import spectral_norm

from gradinv.generators import GENERATORS
from gradinv.generators.base import Context, Generator
from gradinv.progress import Progress
from gradinv.settings import bounded


@GENERATORS.register("dcgan")
class DCGAN(Generator):
    trainable = True

    @dataclass(frozen=True)
    class Settings:
        latent_dim: int = bounded(64, ge=1)
        width: int = bounded(64, ge=4, doc="channels of the last block; doubled per block back")
        embed_dim: int = bounded(32, ge=1, doc="class embedding (conditional generator)")
        conditional: bool = True
        # training (rule train_generator)
        steps: int = bounded(3000, ge=1, doc="discriminator+generator steps")
        batch_size: int = bounded(64, ge=1)
        lr: float = bounded(2e-4, gt=0.0)
        beta1: float = bounded(0.0, ge=0.0, lt=1.0)
        beta2: float = bounded(0.9, ge=0.0, lt=1.0)
        ema: float = bounded(0.999, ge=0.0, lt=1.0, doc="decay of the generator's weight average")
        flip: bool = True  # random horizontal flips of the public images
        log_every: int = bounded(100, ge=1)

    def __init__(self, settings: Settings, resolution: int, channels: int, num_classes: int):
        super().__init__()
        if resolution < 8 or resolution & (resolution - 1):
            raise ValueError(f"the DCGAN needs a power-of-two side >= 8; got {resolution}")
        s = settings
        self.settings = s
        self.latent_shape = (s.latent_dim,)
        self.num_classes = num_classes if s.conditional else 0
        self.resolution = resolution
        self.num_blocks = int(math.log2(resolution // 4))
        widths = [s.width * 2 ** (self.num_blocks - k) for k in range(self.num_blocks + 1)]
        self.embed = nn.Embedding(num_classes, s.embed_dim) if s.conditional else None
        cond = s.embed_dim if s.conditional else 0
        self.project = nn.Sequential(
            nn.Linear(s.latent_dim + cond, widths[0] * 16), nn.Unflatten(1, (widths[0], 4, 4))
        )
        self.stem = nn.Sequential(nn.BatchNorm2d(widths[0]), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.ConvTranspose2d(widths[k], widths[k + 1], 4, 2, 1, bias=False),
                nn.BatchNorm2d(widths[k + 1]),
                nn.ReLU(),
            )
            for k in range(self.num_blocks)
        )
        self.rgb = nn.Conv2d(widths[-1], channels, 3, padding=1)

    def context(self, z: Tensor, labels: Tensor | None, generator: torch.Generator) -> Context:
        ctx = {"latent": z}
        if self.embed is not None:
            if labels is None:
                raise ValueError("the conditional DCGAN needs the class of every image")
            ctx["labels"] = labels
        return ctx

    def head(self, ctx: Context) -> Tensor:
        z = ctx["latent"]
        if self.embed is not None:
            z = torch.cat([z, self.embed(ctx["labels"])], dim=1)
        return self.stem(self.project(z))

    def block(self, k: int, h: Tensor, ctx: Context) -> Tensor:
        return self.blocks[k](h)

    def to_image(self, h: Tensor, ctx: Context) -> Tensor:
        return torch.tanh(self.rgb(h))

    @classmethod
    def build(
        cls, settings: Settings, resolution: int = 32, channels: int = 3, num_classes: int = 10
    ) -> DCGAN:
        return cls(settings, resolution, channels, num_classes)


class Discriminator(nn.Module):
    """Spectrally normalised convolutions halving the side down to 4x4, and a projection head:
    D(x, y) = w·h(x) + embed(y)·h(x) (Miyato & Koyama 2018)."""

    def __init__(self, settings: DCGAN.Settings, resolution: int, channels: int, classes: int):
        super().__init__()
        blocks = int(math.log2(resolution // 4))
        widths = [settings.width * 2**k // 2 for k in range(blocks + 1)]
        layers: list[nn.Module] = [spectral_norm(nn.Conv2d(channels, widths[0], 3, padding=1))]
        for k in range(blocks):
            layers += [
                nn.LeakyReLU(0.1),
                spectral_norm(nn.Conv2d(widths[k], widths[k + 1], 4, 2, 1)),
            ]
        layers.append(nn.LeakyReLU(0.1))
        self.features = nn.Sequential(*layers)
        self.linear = spectral_norm(nn.Linear(widths[-1], 1))
        self.embed = spectral_norm(nn.Embedding(classes, widths[-1])) if classes else None

    def forward(self, x: Tensor, labels: Tensor | None) -> Tensor:
        h = self.features(x).sum(dim=(2, 3))
        out = self.linear(h).squeeze(1)
        if self.embed is not None:
            out = out + (self.embed(labels) * h).sum(1)
        return out


def train_dcgan(
    settings: DCGAN.Settings,
    images: Tensor,
    labels: Tensor,
    num_classes: int,
    generator: torch.Generator,
    progress: Progress | None = None,
    device: torch.device | str = "cpu",
) -> tuple[DCGAN, dict[str, list[tuple[int, float]]]]:
    """Train the DCGAN on ``images`` ((N, C, H, W) in [0, 1]) and ``labels`` on ``device``;
    return the weight-averaged generator (eval mode, on the CPU) and the loss curves. Resumable
    through ``progress``. The random draws (weights, batches, flips, latents) come from the CPU
    generator whatever the device, so a seed picks the same batches and latents on any device."""
    s = settings
    device = torch.device(device)
    n, channels, side = images.shape[0], images.shape[1], images.shape[2]
    g = DCGAN(s, side, channels, num_classes).to(device)
    d = Discriminator(s, side, channels, num_classes if s.conditional else 0).to(device)
    average = DCGAN(s, side, channels, num_classes).to(device)
    average.load_state_dict(g.state_dict())
    average.requires_grad_(False)
    opt_g = torch.optim.Adam(g.parameters(), lr=s.lr, betas=(s.beta1, s.beta2))
    opt_d = torch.optim.Adam(d.parameters(), lr=s.lr, betas=(s.beta1, s.beta2))
    data = (images * 2 - 1).to(device)
    labels = labels.to(device)
    history: dict[str, list[tuple[int, float]]] = {"loss_d": [], "loss_g": []}
    start, saved = 0, progress.load() if progress else None
    if saved is not None:
        for module, key in ((g, "g"), (d, "d"), (average, "average")):
            module.load_state_dict(saved[key])
        opt_g.load_state_dict(saved["opt_g"])
        opt_d.load_state_dict(saved["opt_d"])
        generator.set_state(saved["generator"])
        start, history = saved["step"], saved["history"]
        progress.resumed(f"step {start}")

    def batch() -> tuple[Tensor, Tensor]:
        idx = torch.randint(n, (s.batch_size,), generator=generator).to(device)
        x = data[idx]
        if s.flip:
            flip = (torch.rand(s.batch_size, generator=generator) < 0.5).to(device)
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        return x, labels[idx]

    def fake(count: int, y: Tensor) -> Tensor:
        z = torch.randn(count, s.latent_dim, generator=generator)
        return g(z.to(device), y)

    began = time.perf_counter()
    g.train()
    d.train()
    for step in range(start, s.steps):
        x, y = batch()
        loss_d = F.relu(1 - d(x, y)).mean() + F.relu(1 + d(fake(len(y), y).detach(), y)).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        y = labels[torch.randint(n, (s.batch_size,), generator=generator).to(device)]
        loss_g = -d(fake(len(y), y), y).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        with torch.no_grad():
            for a, p in zip(average.parameters(), g.parameters(), strict=True):
                a.lerp_(p, 1 - s.ema)
            for a, b in zip(average.buffers(), g.buffers(), strict=True):
                a.copy_(b)
        if step % s.log_every == 0 or step == s.steps - 1:
            history["loss_d"].append((step, loss_d.item()))
            history["loss_g"].append((step, loss_g.item()))
            rate = (step + 1 - start) / max(time.perf_counter() - began, 1e-9)
            print(
                f"gradinv: DCGAN step {step}: loss D {loss_d.item():.3f}, G {loss_g.item():.3f} "
                f"({rate:.1f} steps/s)",
                file=sys.stderr,
                flush=True,
            )
        if not (torch.isfinite(loss_d) and torch.isfinite(loss_g)):
            raise RuntimeError(f"DCGAN training diverged at step {step} (non-finite loss)")
        if progress and progress.due():
            progress.save(_state(step + 1, g, d, average, opt_g, opt_d, generator, history))
    average.eval()
    return average.cpu(), history


def _state(step: int, *parts: Any) -> dict[str, Any]:
    g, d, average, opt_g, opt_d, generator, history = parts
    return {
        "step": step,
        "g": g.state_dict(),
        "d": d.state_dict(),
        "average": average.state_dict(),
        "opt_g": opt_g.state_dict(),
        "opt_d": opt_d.state_dict(),
        "generator": generator.get_state(),
        "history": history,
    }
