"""BigGAN-deep (Brock et al. 2019, arXiv:1809.11096) cut into blocks for GIFD (arXiv:2308.04699).

The network is the ``pytorch_pretrained_biggan`` package's own modules (``BigGAN``,
``BigGANConfig``), unchanged, with DeepMind's TF-Hub weights converted by that package
(``pytorch_model.bin``, a state_dict). The package's ``Generator.layers`` are the blocks: its
GenBlocks plus the one self-attention layer, 13 for biggan-deep-256, the ``end_layer`` of the
GIFD code (``inversefed/genmodels/imagenet_biggan_io/model.py``, which slices the same list).

The conditioning vector ``cat(z, embeddings(one_hot(label)))`` is rebuilt from ``ctx`` inside
every block instead of being stored: ``ctx["latent"]`` and ``ctx["embed"]`` are independent
leaves, so an attack can put the latent it optimises in their place.

Architectures, written here so that random-weight tests have the real shapes without the
package's ``config.json`` (not fetchable offline): the ``BigGAN128``/``BigGAN256``/``BigGAN512``
configs of the package's converter (``pytorch_pretrained_biggan/convert_tf_to_pytorch.py``,
which writes them out as the published ``config.json``), the same as Table 8 of the paper's
Appendix B (two blocks per resolution, non-local block at 64x64). Their parameter counts are the
package README's (50.4M, 55.9M, 56.2M); ``tests/test_biggan.py`` checks both.

Spectral norm: the package wraps every conv and linear in ``torch.nn.utils.spectral_norm``. In
eval mode that divides the stored weight by a fixed ``u^T W v``, so it is baked into plain weights
once, after loading (:func:`bake_spectral_norm`): same outputs, and the generator works with
``torch.func`` (``functional_call``, ``vmap``), which the attacks use. The weights are frozen
(``requires_grad`` off): the attacks search the generator's inputs, never its weights.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.spectral_norm import SpectralNorm

from gradinv.generators import GENERATORS
from gradinv.generators.base import Context, Generator, WeightsError
from gradinv.settings import ConfigError, bounded

if TYPE_CHECKING:  # the package is imported on use: it imports scipy.stats, seconds per job
    from pytorch_pretrained_biggan import BigGAN, BigGANConfig

Model = Literal["biggan-deep-128", "biggan-deep-256", "biggan-deep-512"]


def weights_urls() -> dict[str, str]:
    """Where the package downloads each model's pytorch_model.bin (for the fetch rule)."""
    from pytorch_pretrained_biggan.model import PRETRAINED_MODEL_ARCHIVE_MAP

    return dict(PRETRAINED_MODEL_ARCHIVE_MAP)


# GenBlocks as (upsample, in_mult, out_mult); channels are multiples of channel_width (128).
# From 4x4, two blocks per resolution (Table 8); the comments give each block's output side.
_LAYERS_128 = (
    (False, 16, 16), (True, 16, 16),  # 4, 8
    (False, 16, 16), (True, 16, 8),  # 8, 16
    (False, 8, 8), (True, 8, 4),  # 16, 32
    (False, 4, 4), (True, 4, 2),  # 32, 64
    (False, 2, 2), (True, 2, 1),  # 64 (after the attention), 128
)  # fmt: skip
_LAYERS_256 = (
    (False, 16, 16), (True, 16, 16),  # 4, 8
    (False, 16, 16), (True, 16, 8),  # 8, 16
    (False, 8, 8), (True, 8, 8),  # 16, 32
    (False, 8, 8), (True, 8, 4),  # 32, 64
    (False, 4, 4), (True, 4, 2),  # 64 (after the attention), 128
    (False, 2, 2), (True, 2, 1),  # 128, 256
)  # fmt: skip
_LAYERS_512 = (*_LAYERS_256, (False, 1, 1), (True, 1, 1))  # 256, 512

ARCHITECTURES: dict[str, dict] = {
    name: dict(
        output_dim=resolution,
        z_dim=128,
        class_embed_dim=128,
        channel_width=128,
        num_classes=1000,
        layers=[tuple(layer) for layer in layers],
        attention_layer_position=8,  # the non-local block sits before GenBlock 8, at 64x64
        eps=1e-4,
        n_stats=51,  # batch-norm statistics for 51 truncations in [0, 1]
    )
    for name, resolution, layers in (
        ("biggan-deep-128", 128, _LAYERS_128),
        ("biggan-deep-256", 256, _LAYERS_256),
        ("biggan-deep-512", 512, _LAYERS_512),
    )
}


def config(model: str) -> BigGANConfig:
    """The package's config of ``model`` (one of :data:`ARCHITECTURES`)."""
    if model not in ARCHITECTURES:
        close = difflib.get_close_matches(model, ARCHITECTURES, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(ARCHITECTURES)}."
        raise ConfigError(f"generators.biggan.model: unknown BigGAN {model!r}; {hint}")
    from pytorch_pretrained_biggan import BigGANConfig

    arch = ARCHITECTURES[model]
    return BigGANConfig(**{**arch, "layers": list(arch["layers"])})


def package_model(model: str) -> BigGAN:
    """The package's ``BigGAN`` of ``model``'s architecture with fresh weights, spectral norm on.

    The package leaves two things to the checkpoint that a random model needs for a finite
    forward: the final batch norm's affine weights (uninitialised memory; set to 1 and 0), and
    spectral norm's singular vectors (random, so ``u^T W v`` can be ~0 or negative; settled by
    power iteration as training would). Running statistics stay the package's (means 0, vars 1).
    """
    from pytorch_pretrained_biggan import BigGAN

    net = BigGAN(config(model)).eval()
    with torch.no_grad():
        net.generator.bn.weight.fill_(1.0)
        net.generator.bn.bias.zero_()
        for module in net.modules():
            for hook in list(module._forward_pre_hooks.values()):
                if isinstance(hook, SpectralNorm):
                    for _ in range(20):
                        hook.compute_weight(module, do_power_iteration=True)
    return net


def bake_spectral_norm(module: nn.Module) -> nn.Module:
    """``module`` with every spectral norm replaced by the plain weight it gives in eval mode."""
    for sub in module.modules():
        for hook in [h for h in sub._forward_pre_hooks.values() if isinstance(h, SpectralNorm)]:
            nn.utils.remove_spectral_norm(sub, name=hook.name)
    return module


@GENERATORS.register("biggan")
class BigGANDeep(Generator):
    """BigGAN-deep of ``settings.model``, blocks = the package's ``generator.layers``."""

    @dataclass(frozen=True)
    class Settings:
        model: Model = "biggan-deep-256"
        truncation: float = bounded(
            1.0, gt=0.0, le=1.0, doc="batch-norm statistics' truncation (1.0 in the GIFD/GGL code)"
        )

    def __init__(self, settings: Settings, net: BigGAN) -> None:
        """Wraps ``net`` (the package's ``BigGAN``, spectral norm on); bakes and freezes it."""
        super().__init__()
        self.settings = settings
        self.truncation = float(settings.truncation)  # the package indexes its statistics by it
        self.config = net.config
        self.embeddings = net.embeddings  # state_dict keys stay the package's
        self.generator = net.generator
        self.eval()
        bake_spectral_norm(self)
        self.requires_grad_(False)
        self.latent_shape = (net.config.z_dim,)
        self.num_classes = net.config.num_classes
        self.resolution = net.config.output_dim
        self.num_blocks = len(self.generator.layers)
        from pytorch_pretrained_biggan.model import GenBlock

        # the blocks that take the class condition (all but the self-attention layer)
        self.conditioned = {
            k for k, m in enumerate(self.generator.layers) if isinstance(m, GenBlock)
        }

    # ------------------------------------------------------------------ blocks
    def context(self, z: Tensor, labels: Tensor | None, generator: torch.Generator) -> Context:
        if labels is None:
            raise ValueError(
                "BigGAN is class-conditional: context() needs the labels (N,) of the images"
            )
        if z.ndim != 2 or tuple(z.shape[1:]) != self.latent_shape:
            raise ValueError(
                f"BigGAN latents are (N, {self.latent_shape[0]}); got {tuple(z.shape)}"
            )
        if labels.shape != (z.shape[0],) or labels.is_floating_point():
            raise ValueError(
                f"BigGAN labels are {z.shape[0]} class indices (int64, shape ({z.shape[0]},)); "
                f"got {labels.dtype} of shape {tuple(labels.shape)}"
            )
        weight = self.embeddings.weight
        one_hot = F.one_hot(labels.long().to(weight.device), self.num_classes).to(weight.dtype)
        return {"latent": z, "embed": self.embeddings(one_hot)}

    def head(self, ctx: Context) -> Tensor:
        h = self.generator.gen_z(self._condition(ctx))
        # The package's conversion from TF's (N, H, W, C) layout.
        h = h.view(-1, 4, 4, 16 * self.config.channel_width)
        return h.permute(0, 3, 1, 2).contiguous()

    def block(self, k: int, h: Tensor, ctx: Context) -> Tensor:
        layer = self.generator.layers[k]
        if k in self.conditioned:
            return layer(h, self._condition(ctx), self.truncation)
        return layer(h)  # the self-attention layer

    def to_image(self, h: Tensor, ctx: Context) -> Tensor:
        g = self.generator
        h = g.conv_to_rgb(g.relu(g.bn(h, self.truncation)))
        return g.tanh(h[:, :3, ...])

    def _condition(self, ctx: Context) -> Tensor:
        return torch.cat((ctx["latent"], ctx["embed"]), dim=1)

    # ------------------------------------------------------------------ weights
    @classmethod
    def build(cls, settings: Settings) -> BigGANDeep:
        return cls(settings, package_model(settings.model))

    @classmethod
    def load(cls, settings: Settings, path: Path, name: str) -> BigGANDeep:
        """``path``: the package's ``pytorch_model.bin`` of ``settings.model``, loaded strictly."""
        from pytorch_pretrained_biggan import BigGAN

        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, Mapping):
            raise WeightsError(
                f"generator {name}: {path} holds a {type(state).__name__}, not the state_dict of "
                f"pytorch-pretrained-biggan's {settings.model}"
            )
        with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
            expected = BigGAN(config(settings.model)).state_dict()
        problems = _mismatches(state, expected)
        if problems:
            raise WeightsError(
                f"generator {name}: {path} is not a state_dict of pytorch-pretrained-biggan's "
                f"{settings.model}: {'; '.join(problems)}"
            )
        net = BigGAN(config(settings.model))
        net.load_state_dict(state, strict=True)
        return cls(settings, net)


def _mismatches(state: Mapping[str, object], expected: Mapping[str, Tensor]) -> list[str]:
    """What keeps ``state`` from loading into a model whose state_dict is ``expected``."""

    def listed(keys: list[str]) -> str:
        shown = ", ".join(keys[:5])
        return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} is {tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}, "
        f"expected {tuple(expected[k].shape)}"
        for k, v in state.items()
        if k in expected and not (isinstance(v, Tensor) and v.shape == expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {listed(unexpected)}")
    if shapes:
        problems.append(f"wrong shapes: {listed(shapes)}")
    return problems


__all__ = [
    "ARCHITECTURES",
    "BigGANDeep",
    "bake_spectral_norm",
    "config",
    "package_model",
    "weights_urls",
]
