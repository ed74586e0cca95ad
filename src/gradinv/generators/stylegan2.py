"""StyleGAN2 config-f (Karras et al. 2020, arXiv:1912.04958) in plain PyTorch.

The generator GIFD (Fang et al. 2023, arXiv:2308.04699) searches on FFHQ. Its modules, parameter
and buffer names and shapes are those of rosinality/stylegan2-pytorch ``Generator(size,
style_dim, n_mlp, channel_multiplier)``, so ``load_state_dict(torch.load(ckpt)["g_ema"])`` takes
the converted public checkpoint ``stylegan2-ffhq-config-f.pt`` as it is. No custom CUDA op: the
FIR filter (``upfirdn2d``) and the fused leaky ReLU are ordinary ``F.pad``/``F.conv2d``/
``F.leaky_relu`` calls, computing what rosinality's native CPU path computes. The modulated
convolution uses rosinality's unfused form (style the input, convolve with the shared weight,
demodulate the output), the same function as its grouped form up to float rounding, and cheaper
for a batch.

The chain (see base.py). Block 0 is the 4x4 stage (``conv1``, ``to_rgb1``); block i >= 1 is one
resolution step (the upsampling ``convs[2i-2]``, ``convs[2i-1]``, ``to_rgbs[i-1]``, which adds
the upsampled skip image). StyleGAN2 carries an RGB skip image beside the features, so the tensor
between blocks is the two concatenated along channels: ``h = cat([features, skip])``, with the
skip's 3 channels last. :meth:`StyleGAN2.head` is the constant input beside a zero skip;
:meth:`StyleGAN2.to_image` returns the skip channels. Row ``2i - 1``, ``2i`` and ``2i + 1`` of
the W+ latent drive block i's two convolutions and its ToRGB (rows 0 and 1 for block 0), and
noise maps ``noise{2i-1}``, ``noise{2i}`` (``noise0`` for block 0), as in rosinality's forward.

Where GIFD's code differs: its intermediate stages restart the skip image from nothing (it calls
the generator with ``skip=None``), dropping the RGB of the blocks before the stage; an attack gets
that by zeroing ``h[:, -3:]`` before :meth:`~gradinv.generators.base.Generator.synthesize`.

Starting latents (:meth:`StyleGAN2.sample_latent`) follow GIFD's ``MappingProxy``: W+ =
LeakyReLU_0.2(std * N(0, I) + mean), with mean and std PULSE's "Gaussian fit" of the mapping
network's output before its last leaky ReLU, computed here from the generator's own mapping
network (seeded) instead of being read from ``gaussian_fit.pt``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.generators import GENERATORS
from gradinv.generators.base import Context, Generator, WeightsError
from gradinv.settings import bounded

BLUR_TAPS = (1.0, 3.0, 3.0, 1.0)
SLOPE = 0.2  # of every leaky ReLU in StyleGAN2
GAIN = math.sqrt(2.0)  # the fused leaky ReLU's output scale


def upfirdn2d(x: Tensor, kernel: Tensor, up: int = 1, pad: tuple[int, int] = (0, 0)) -> Tensor:
    """Upsample by zero insertion, pad, then filter with the FIR ``kernel`` (a true convolution,
    hence the flip), every channel on its own: rosinality's ``upfirdn2d`` with ``down=1``."""
    n, c, h, w = x.shape
    if up > 1:  # each sample followed by up - 1 zeros, along both axes
        x = F.pad(x.reshape(n, c, h, 1, w, 1), (0, up - 1, 0, 0, 0, up - 1))
        x = x.reshape(n, c, h * up, w * up)
    x = F.pad(x, (pad[0], pad[1], pad[0], pad[1]))
    weight = kernel.flip(0, 1).to(x.dtype).expand(c, 1, *kernel.shape)
    return F.conv2d(x, weight, groups=c)  # depthwise: far faster on CPU than one channel a time


def fir_kernel(taps: tuple[float, ...], gain: float = 1.0) -> Tensor:
    """The separable 2-d FIR kernel of ``taps``, normalised to sum to ``gain``."""
    k = torch.tensor(taps, dtype=torch.float32)
    k = k[None, :] * k[:, None]
    return k / k.sum() * gain


class PixelNorm(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.square().mean(dim=1, keepdim=True) + 1e-8)


class FusedLeakyReLU(nn.Module):
    """Per-channel bias, leaky ReLU (slope 0.2), times sqrt(2)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        return fused_leaky_relu(x, self.bias)


def fused_leaky_relu(x: Tensor, bias: Tensor) -> Tensor:
    bias = bias.view(1, -1, *([1] * (x.ndim - 2)))
    return F.leaky_relu(x + bias, SLOPE) * GAIN


class EqualLinear(nn.Module):
    """Linear layer with the equalized learning rate: the weight is stored N(0, 1/lr_mul) and
    scaled by lr_mul / sqrt(fan_in) at run time, the bias scaled by lr_mul."""

    def __init__(
        self, d_in: int, d_out: int, bias_init: float = 0.0, lr_mul: float = 1.0, act: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / lr_mul)
        self.bias = nn.Parameter(torch.full((d_out,), float(bias_init)))
        self.scale, self.lr_mul, self.act = lr_mul / math.sqrt(d_in), lr_mul, act

    def forward(self, x: Tensor) -> Tensor:
        if self.act:
            return fused_leaky_relu(F.linear(x, self.weight * self.scale), self.bias * self.lr_mul)
        return F.linear(x, self.weight * self.scale, self.bias * self.lr_mul)


class Blur(nn.Module):
    def __init__(self, pad: tuple[int, int], gain: float) -> None:
        super().__init__()
        self.register_buffer("kernel", fir_kernel(BLUR_TAPS, gain))
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        return upfirdn2d(x, self.kernel, pad=self.pad)


class Upsample(nn.Module):
    """2x upsampling of the skip image: zero insertion and the [1, 3, 3, 1] filter."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("kernel", fir_kernel(BLUR_TAPS, gain=4.0))
        self.pad = (2, 1)  # len(taps) - 2 split as rosinality: ((p+1)//2 + 1, p//2)

    def forward(self, x: Tensor) -> Tensor:
        return upfirdn2d(x, self.kernel, up=2, pad=self.pad)


class ModulatedConv2d(nn.Module):
    """Convolution whose input channels are scaled by an affine map of the style, then (with
    ``demodulate``) each output channel divided by the norm of its effective weight. With
    ``upsample``: a stride-2 transposed convolution followed by the [1, 3, 3, 1] blur."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        k: int,
        style_dim: int,
        demodulate: bool = True,
        upsample: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, c_out, c_in, k, k))
        self.modulation = EqualLinear(style_dim, c_in, bias_init=1.0)
        self.scale, self.padding = 1 / math.sqrt(c_in * k * k), k // 2
        self.demodulate, self.upsample = demodulate, upsample
        if upsample:  # transposed conv grows H to 2H + k - 2; the blur trims it back to 2H
            p = len(BLUR_TAPS) - 2 - (k - 1)
            self.blur = Blur(pad=((p + 1) // 2 + 1, p // 2 + 1), gain=4.0)

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        weight = self.weight[0] * self.scale  # (c_out, c_in, k, k)
        style = self.modulation(w)  # (n, c_in)
        x = x * style[:, :, None, None]
        if self.upsample:
            out = self.blur(F.conv_transpose2d(x, weight.transpose(0, 1), stride=2))
        else:
            out = F.conv2d(x, weight, padding=self.padding)
        if self.demodulate:  # 1 / |weight * style| over (c_in, k, k), per sample and output
            energy = style.square() @ weight.square().sum((2, 3)).T
            out = out * torch.rsqrt(energy + 1e-8)[:, :, None, None]
        return out


class NoiseInjection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, noise: Tensor) -> Tensor:
        return x + self.weight * noise


class ConstantInput(nn.Module):
    def __init__(self, channels: int, size: int = 4) -> None:
        super().__init__()
        self.input = nn.Parameter(torch.randn(1, channels, size, size))


class StyledConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, style_dim: int, upsample: bool = False) -> None:
        super().__init__()
        self.conv = ModulatedConv2d(c_in, c_out, 3, style_dim, upsample=upsample)
        self.noise = NoiseInjection()
        self.activate = FusedLeakyReLU(c_out)

    def forward(self, x: Tensor, w: Tensor, noise: Tensor) -> Tensor:
        return self.activate(self.noise(self.conv(x, w), noise))


class ToRGB(nn.Module):
    def __init__(self, c_in: int, style_dim: int, upsample: bool = True) -> None:
        super().__init__()
        self.upsample = Upsample() if upsample else None
        self.conv = ModulatedConv2d(c_in, 3, 1, style_dim, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(self, x: Tensor, w: Tensor, skip: Tensor) -> Tensor:
        if self.upsample is not None:
            skip = self.upsample(skip)
        return self.conv(x, w) + self.bias + skip


def _forget_gaussian_fit(module: StyleGAN2, incompatible_keys: Any) -> None:
    module._gaussian_fit = None


@GENERATORS.register("stylegan2")
class StyleGAN2(Generator):
    @dataclass(frozen=True)
    class Settings:
        size: Literal[4, 8, 16, 32, 64, 128, 256, 512, 1024] = 1024
        style_dim: int = bounded(512, ge=1)
        n_mlp: int = bounded(8, ge=1, doc="layers of the mapping network")
        channel_multiplier: int = bounded(2, ge=1, doc="2 is config-f")
        lr_mlp: float = bounded(0.01, gt=0.0, doc="learning-rate multiplier of the mapping net")
        max_channels: int = bounded(
            512, ge=1, doc="cap on feature channels; below 512 only for tiny test generators"
        )
        gaussian_fit_samples: int = bounded(
            10_000, ge=2, doc="mapped latents behind the W+ Gaussian fit of sample_latent"
        )
        # not a small seed: a generator built under torch.manual_seed(0) drew its mapping weights
        # from the stream seed 0 starts, and the fit's first draws would line up with them
        gaussian_fit_seed: int = bounded(20_230_808, ge=0)

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        s = self.settings = settings
        self.size, self.style_dim = s.size, s.style_dim
        self.log_size = int(math.log2(s.size))
        m = s.channel_multiplier
        wide = {4: 512, 8: 512, 16: 512, 32: 512, 64: 256 * m, 128: 128 * m, 256: 64 * m}
        wide |= {512: 32 * m, 1024: 16 * m}
        self.channels = {r: min(c, s.max_channels) for r, c in wide.items()}

        self.style = nn.Sequential(
            PixelNorm(),
            *(
                EqualLinear(s.style_dim, s.style_dim, lr_mul=s.lr_mlp, act=True)
                for _ in range(s.n_mlp)
            ),
        )
        c4 = self.channels[4]
        self.input = ConstantInput(c4)
        self.conv1 = StyledConv(c4, c4, s.style_dim)
        self.to_rgb1 = ToRGB(c4, s.style_dim, upsample=False)
        self.convs, self.upsamples, self.to_rgbs = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        self.noises = nn.Module()  # rosinality's fixed noise maps: loaded, not used by the chain
        self.num_layers = 2 * self.log_size - 3
        for i in range(self.num_layers):
            self.noises.register_buffer(f"noise_{i}", torch.randn(1, 1, *self.noise_shape(i)))
        c_in = c4
        for level in range(3, self.log_size + 1):
            c_out = self.channels[2**level]
            self.convs.append(StyledConv(c_in, c_out, s.style_dim, upsample=True))
            self.convs.append(StyledConv(c_out, c_out, s.style_dim))
            self.to_rgbs.append(ToRGB(c_out, s.style_dim))
            c_in = c_out
        self.n_latent = 2 * self.log_size - 2

        self.latent_shape = (self.n_latent, s.style_dim)
        self.num_classes = 0
        self.resolution = s.size
        self.num_blocks = self.log_size - 1
        self._gaussian_fit: tuple[Tensor, Tensor] | None = None
        self.register_load_state_dict_post_hook(_forget_gaussian_fit)  # new mapping, new fit

    # ------------------------------------------------------------------ the chain
    def noise_shape(self, i: int) -> tuple[int, int]:
        """Side of noise map ``i`` (rosinality's ``noise_i``)."""
        r = 2 ** ((i + 5) // 2)
        return r, r

    def context(self, z: Tensor, labels: Tensor | None, generator: torch.Generator) -> Context:
        if z.shape[1:] != self.latent_shape:
            raise ValueError(
                f"StyleGAN2 latents are W+ of shape (N, {self.n_latent}, {self.style_dim}); "
                f"got {tuple(z.shape)}"
            )
        ctx = {"latent": z}
        for i in range(self.num_layers):
            noise = torch.randn((z.shape[0], 1, *self.noise_shape(i)), generator=generator)
            ctx[f"noise{i}"] = noise.to(device=z.device, dtype=z.dtype)
        return ctx

    def head(self, ctx: Context) -> Tensor:
        n = ctx["latent"].shape[0]
        const = self.input.input.expand(n, -1, -1, -1)
        return torch.cat([const, const.new_zeros(n, 3, 4, 4)], dim=1)

    def block(self, k: int, h: Tensor, ctx: Context) -> Tensor:
        if not 0 <= k < self.num_blocks:
            raise ValueError(f"StyleGAN2 has blocks 0..{self.num_blocks - 1}; got block {k}")
        r = 4 * 2 ** max(k - 1, 0)
        c = self.channels[r] + 3
        if h.shape[1:] != (c, r, r):
            raise ValueError(
                f"block {k} takes (N, {c}, {r}, {r}) (features + skip RGB); got {tuple(h.shape)}"
            )
        x, skip = h[:, :-3], h[:, -3:]
        w = ctx["latent"]
        if k == 0:
            x = self.conv1(x, w[:, 0], ctx["noise0"])
            skip = self.to_rgb1(x, w[:, 1], skip)  # head's skip is zero: rosinality's to_rgb1
        else:
            x = self.convs[2 * k - 2](x, w[:, 2 * k - 1], ctx[f"noise{2 * k - 1}"])
            x = self.convs[2 * k - 1](x, w[:, 2 * k], ctx[f"noise{2 * k}"])
            skip = self.to_rgbs[k - 1](x, w[:, 2 * k + 1], skip)
        return torch.cat([x, skip], dim=1)

    def to_image(self, h: Tensor, ctx: Context) -> Tensor:
        """The skip image. StyleGAN2 has no tanh: the image is not clamped to [-1, 1]."""
        return h[:, -3:]

    def searched_context(self, stage: int) -> tuple[str, ...]:
        """GIFD's code optimises the latent and noise maps ``range(5 + 2 * stage)`` at every
        stage (at stage 0 the latent is also the stage's input)."""
        last = min(5 + 2 * stage, self.num_layers)
        return ("latent", *(f"noise{i}" for i in range(last)))

    def spherical(self, name: str) -> bool:
        return name == "latent" or name.startswith("noise")

    # ------------------------------------------------------------------ latents
    def mapping(self, z: Tensor) -> Tensor:
        """The style MLP: Z (N, style_dim) -> W (N, style_dim)."""
        return self.style(z)

    def mean_latent(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """The mean W of ``n`` mapped N(0, I) draws, shape (1, style_dim) (rosinality's)."""
        z = torch.randn((n, self.style_dim), generator=generator).to(self.input.input)
        return self.mapping(z).mean(0, keepdim=True)

    @torch.no_grad()
    def gaussian_fit(self) -> tuple[Tensor, Tensor]:
        """Per-dimension mean and std of the mapping network's output before its last leaky
        ReLU (PULSE's ``gaussian_fit.pt``), on the CPU; computed once, from
        ``gaussian_fit_samples`` seeded draws."""
        if self._gaussian_fit is None:
            s = self.settings
            g = torch.Generator().manual_seed(s.gaussian_fit_seed)
            chunks = []
            for start in range(0, s.gaussian_fit_samples, 2048):
                n = min(2048, s.gaussian_fit_samples - start)
                w = self.mapping(torch.randn((n, s.style_dim), generator=g).to(self.input.input))
                chunks.append(torch.where(w < 0, w / SLOPE, w).double().cpu())  # undo the lrelu
            pre = torch.cat(chunks)
            self._gaussian_fit = (pre.mean(0).float(), pre.std(0).float())
        return self._gaussian_fit

    def sample_latent(self, n: int, generator: torch.Generator) -> Tensor:
        """GIFD's start: W+ = LeakyReLU_0.2(std * N(0, I) + mean), on the CPU."""
        mean, std = self.gaussian_fit()
        return F.leaky_relu(
            std * torch.randn((n, *self.latent_shape), generator=generator) + mean, SLOPE
        )

    # ------------------------------------------------------------------ weights
    @classmethod
    def build(cls, settings: Settings) -> StyleGAN2:
        return cls(settings)

    @classmethod
    def load(cls, settings: Settings, path: Path, name: str) -> StyleGAN2:
        """A rosinality checkpoint: a dict whose ``g_ema`` is the generator's state dict (as
        ``convert_weight.py`` writes it), or that state dict alone."""
        model = cls.build(settings)
        expected = (
            f"Expected a torch.save'd dict with key 'g_ema' holding the state dict of "
            f"rosinality/stylegan2-pytorch Generator(size={settings.size}, "
            f"style_dim={settings.style_dim}, n_mlp={settings.n_mlp}, "
            f"channel_multiplier={settings.channel_multiplier}), or that state dict itself."
        )
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for foreign or unsafe files
            raise WeightsError(
                f"generator {name}: {path} cannot be read as tensors only "
                f"(torch.load weights_only=True): {err}. {expected}"
            ) from err
        state = ckpt.get("g_ema", ckpt) if isinstance(ckpt, Mapping) else None
        if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
            raise WeightsError(
                f"generator {name}: {path} holds no generator state dict. {expected}"
            )
        own = model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        wrong = [
            f"{k} {tuple(state[k].shape)} (needs {tuple(v.shape)})"
            for k, v in own.items()
            if k in state and state[k].shape != v.shape
        ]
        problems = [
            f"{label} ({len(keys)}): {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}"
            for label, keys in (
                ("missing keys", missing),
                ("unexpected keys", unexpected),
                ("wrong shapes", wrong),
            )
            if keys
        ]
        if problems:
            raise WeightsError(
                f"generator {name}: {path} does not fit StyleGAN2 {settings}: "
                f"{'; '.join(problems)}. {expected}"
            )
        model.load_state_dict(state)
        return model.eval()
