"""The generator interface the generative-prior attacks (GGL, GIAS, GIFD) search.

A generator maps a latent code (and, if conditional, a class) to an image in [-1, 1]. GIFD
(Fang et al. 2023) also starts and stops it at intermediate layers, so every generator is written
as a chain the attacks can cut anywhere::

    ctx = g.context(z, labels, generator)   # what every block reads besides its input
    h   = g.head(ctx)                       # the input of block 0
    h   = g.block(k, h, ctx)                # k = 0 .. num_blocks - 1
    x   = g.to_image(h, ctx)                # (N, 3, resolution, resolution) in [-1, 1]

``ctx`` is a dict of tensors, one row per image: the latent itself (``ctx["latent"]``) and
whatever the blocks derive from it (BigGAN's conditioning vector, StyleGAN2's noise maps). GIFD's
stage 0 optimises the latent; its stage k optimises the input of block k, plus the context
entries :meth:`Generator.searched_context` names (StyleGAN2: the W+ latent and the first noise
maps; BigGAN and the DCGAN: none, their conditioning stays where stage 0 left it).

Weights: a generator is either trained by the pipeline (``trainable``: the DCGAN, rule
``train_generator``) or pretrained and fetched (BigGAN, StyleGAN2; rule ``fetch_generator``), and
every weights file is checked against a recorded sha256 before it is loaded
(:func:`verified_weights`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from gradinv.io import sha256_file, snakemake_command

Context = dict[str, Tensor]


class WeightsError(RuntimeError):
    """A generator's weights file is missing or is not the recorded one."""


def verified_weights(path: str | Path, sha256: str, source: str, name: str) -> Path:
    """``path`` after checking that it exists and that its sha256 is ``sha256``.

    The error names the file, the expected (and found) sha256 and where to get the right one.
    """
    path = Path(path)
    fix = (
        f"Fetch it from {source} (expected sha256 {sha256 or '<not recorded>'}) and put it at "
        f"{path}, or run `{snakemake_command(path)}`."
    )
    if not path.is_file():
        raise WeightsError(f"generator {name}: weights file {path} does not exist. {fix}")
    if not sha256:
        raise WeightsError(
            f"generator {name}: no sha256 is recorded for {path}, so it cannot be verified; "
            f"set generators.{name}.sha256 (source: {source})."
        )
    found = sha256_file(path)
    if found != sha256:
        raise WeightsError(
            f"generator {name}: {path} has sha256 {found}, expected {sha256}: it is not the "
            f"published checkpoint (truncated, another version, or another file). {fix}"
        )
    return path


class Generator(nn.Module):
    """An image generator cut into blocks (see the module doc). Subclasses set the attributes
    below in ``__init__`` and implement :meth:`context`, :meth:`head`, :meth:`block` and
    :meth:`to_image`; ``Settings`` is their frozen settings dataclass."""

    Settings: ClassVar[type]
    trainable: ClassVar[bool] = False  # trained by the pipeline (else pretrained and fetched)

    latent_shape: tuple[int, ...]  # one image's latent, e.g. (128,) or StyleGAN2's W+ (18, 512)
    num_classes: int  # 0: unconditional (the labels are ignored)
    resolution: int  # side of the generated image
    num_blocks: int  # blocks between head and to_image: GIFD's stages are 0 .. num_blocks

    # ------------------------------------------------------------------ to implement
    def context(self, z: Tensor, labels: Tensor | None, generator: torch.Generator) -> Context:
        """Everything the blocks read besides their input; ``ctx["latent"]`` is ``z``. Random
        inputs (StyleGAN2's noise maps) are drawn from ``generator`` on the CPU."""
        raise NotImplementedError

    def head(self, ctx: Context) -> Tensor:
        """The input of block 0."""
        raise NotImplementedError

    def block(self, k: int, h: Tensor, ctx: Context) -> Tensor:
        """Block ``k``'s output (the input of block k + 1, or of :meth:`to_image`)."""
        raise NotImplementedError

    def to_image(self, h: Tensor, ctx: Context) -> Tensor:
        """The image in [-1, 1] from the last block's output."""
        raise NotImplementedError

    # ------------------------------------------------------------------ may override
    def sample_latent(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` starting latents on the CPU (default N(0, I))."""
        return torch.randn((n, *self.latent_shape), generator=generator)

    def searched_context(self, stage: int) -> tuple[str, ...]:
        """The context entries GIFD optimises at ``stage`` besides the stage's input (default:
        none; at stage 0 the latent is the input)."""
        return ()

    def spherical(self, name: str) -> bool:
        """Whether GIFD keeps context entry ``name`` (or the latent) on its sphere."""
        return name == "latent"

    # ------------------------------------------------------------------ provided
    def features(self, ctx: Context, stop: int) -> Tensor:
        """The input of block ``stop`` (``stop == num_blocks``: the input of to_image)."""
        self._check_stage(stop)
        h = self.head(ctx)
        for k in range(stop):
            h = self.block(k, h, ctx)
        return h

    def synthesize(self, h: Tensor, ctx: Context, start: int) -> Tensor:
        """The image from ``h``, the input of block ``start``."""
        self._check_stage(start)
        for k in range(start, self.num_blocks):
            h = self.block(k, h, ctx)
        return self.to_image(h, ctx)

    def forward(
        self, z: Tensor, labels: Tensor | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        ctx = self.context(z, labels, generator or torch.Generator().manual_seed(0))
        return self.synthesize(self.head(ctx), ctx, 0)

    def _check_stage(self, k: int) -> None:
        if not 0 <= k <= self.num_blocks:
            raise ValueError(
                f"{type(self).__name__} has blocks 0..{self.num_blocks - 1}; stage {k} is not "
                f"one of 0..{self.num_blocks}"
            )

    # ------------------------------------------------------------------ weights
    @classmethod
    def build(cls, settings: Any) -> Generator:
        """A generator of ``settings``' architecture with freshly initialised weights."""
        raise NotImplementedError

    @classmethod
    def load(cls, settings: Any, path: Path, name: str) -> Generator:
        """The generator with the weights of ``path`` (already verified by the caller)."""
        raise NotImplementedError
