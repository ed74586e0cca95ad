"""StyleGAN2 (config-f, rosinality layout): names and shapes, the math of its layers, the chain
cut anywhere, checkpoint loading and GIFD's starting latents.

rosinality's code needs its CUDA ops, so it cannot run here: the reference is its state-dict
layout written out below (from its model.py, Generator(1024, 512, 8, channel_multiplier=2)) and
the layers recomputed by hand from their definitions.
"""

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from gradinv.generators import GENERATORS, WeightsError
from gradinv.generators.stylegan2 import StyleGAN2, upfirdn2d
from gradinv.settings import settings_schema

TINY = StyleGAN2.Settings(size=32, style_dim=32, n_mlp=2, max_channels=16, gaussian_fit_samples=256)

# rosinality's Generator(1024, 512, 8, 2): 8 mapping layers (weight, bias), the constant,
# conv1 (5), to_rgb1 (4), 8 upsampling StyledConvs (6: with the blur kernel), 8 StyledConvs (5),
# 8 ToRGBs (5: with the upsample kernel), 17 noise buffers.
N_KEYS_1024 = 16 + 1 + 5 + 4 + 8 * 6 + 8 * 5 + 8 * 5 + 17
GOLDEN_1024 = {
    "style.1.weight": (512, 512),
    "style.8.bias": (512,),
    "input.input": (1, 512, 4, 4),
    "conv1.conv.weight": (1, 512, 512, 3, 3),
    "conv1.conv.modulation.weight": (512, 512),
    "conv1.conv.modulation.bias": (512,),
    "conv1.noise.weight": (1,),
    "conv1.activate.bias": (512,),
    "to_rgb1.conv.weight": (1, 3, 512, 1, 1),
    "to_rgb1.conv.modulation.weight": (512, 512),
    "to_rgb1.bias": (1, 3, 1, 1),
    "convs.0.conv.weight": (1, 512, 512, 3, 3),
    "convs.0.conv.blur.kernel": (4, 4),
    "convs.8.conv.weight": (1, 256, 512, 3, 3),  # 128 px: 128 * 2 channels
    "convs.14.conv.weight": (1, 32, 64, 3, 3),  # 1024 px: 16 * 2 channels
    "convs.14.conv.modulation.weight": (64, 512),
    "convs.15.activate.bias": (32,),
    "convs.15.noise.weight": (1,),
    "to_rgbs.0.upsample.kernel": (4, 4),
    "to_rgbs.7.conv.weight": (1, 3, 32, 1, 1),
    "to_rgbs.7.conv.modulation.bias": (32,),
    "to_rgbs.7.bias": (1, 3, 1, 1),
    "noises.noise_0": (1, 1, 4, 4),
    "noises.noise_1": (1, 1, 8, 8),
    "noises.noise_16": (1, 1, 1024, 1024),
}
NOT_IN_1024 = ["conv1.conv.blur.kernel", "to_rgb1.upsample.kernel", "convs.1.conv.blur.kernel"]


def tiny(seed: int = 0) -> StyleGAN2:
    """A tiny generator whose noise strengths and biases are not zero (they start at zero)."""
    torch.manual_seed(seed)
    g = StyleGAN2.build(TINY)
    with torch.no_grad():
        for name, p in g.named_parameters():
            if (
                name.endswith(("noise.weight", "activate.bias", "bias"))
                and "modulation" not in name
            ):
                p.normal_(0.0, 0.3)
    return g


@pytest.fixture(scope="module")
def big():
    """config-f at 1024 with random weights, one image run through the chain block by block."""
    torch.manual_seed(0)
    g = StyleGAN2.build(StyleGAN2.Settings()).eval()
    z = g.sample_latent(1, torch.Generator().manual_seed(1))
    with torch.no_grad():
        ctx = g.context(z, None, torch.Generator().manual_seed(2))
        hs = [g.head(ctx)]
        for k in range(g.num_blocks):
            hs.append(g.block(k, hs[-1], ctx))
        image = g.to_image(hs[-1], ctx)
    return g, ctx, hs, image


# ---------------------------------------------------------------- layout
def test_state_dict_is_rosinalitys_layout(big):
    g = big[0]
    shapes = {k: tuple(v.shape) for k, v in g.state_dict().items()}
    assert len(shapes) == N_KEYS_1024 == 171
    assert {k: shapes.get(k) for k in GOLDEN_1024} == GOLDEN_1024
    assert not set(NOT_IN_1024) & set(shapes)
    assert [k for k in shapes if k.startswith("noises.")] == [
        f"noises.noise_{i}" for i in range(17)
    ]
    assert sum(p.numel() for p in g.parameters()) == 30_370_060  # config-f G, 30.37 M


def test_generator_attributes_and_registry(big):
    g = big[0]
    assert GENERATORS.get("stylegan2") is StyleGAN2
    assert g.latent_shape == (18, 512) and g.num_classes == 0
    assert g.resolution == 1024 and g.num_blocks == 9
    assert "size" in settings_schema(StyleGAN2.Settings)["properties"]


def test_searched_context_follows_gifd(big):
    g = big[0]
    assert g.searched_context(0) == ("latent", *(f"noise{i}" for i in range(5)))
    assert g.searched_context(3) == ("latent", *(f"noise{i}" for i in range(11)))
    assert g.searched_context(9) == ("latent", *(f"noise{i}" for i in range(17)))
    assert g.spherical("latent") and g.spherical("noise7") and not g.spherical("h")


# ---------------------------------------------------------------- the chain at 1024
def test_features_have_the_declared_shape_at_every_stage(big):
    g, ctx, hs, image = big
    for k in range(g.num_blocks + 1):
        r = 4 * 2 ** max(k - 1, 0)
        assert hs[k].shape == (1, g.channels[r] + 3, r, r), k
    assert hs[-1].shape == (1, 32 + 3, 1024, 1024)
    with torch.no_grad():
        for k in range(7):  # the cheap ones: features() is the same chain
            assert torch.equal(g.features(ctx, k), hs[k])
    assert image.shape == (1, 3, 1024, 1024)
    assert torch.isfinite(image).all() and image.std() > 0.1
    assert torch.equal(hs[0][:, -3:], torch.zeros(1, 3, 4, 4))  # head: constant + zero skip


def test_cutting_the_chain_at_1024_changes_nothing(big):
    g, ctx, hs, image = big
    with torch.no_grad():
        assert torch.equal(g(ctx["latent"], generator=torch.Generator().manual_seed(2)), image)
        for k in (g.num_blocks - 1, g.num_blocks):
            assert torch.equal(g.synthesize(hs[k], ctx, k), image)


def test_context_draws_noise_from_the_generator(big):
    g, ctx, _, _ = big
    again = g.context(ctx["latent"], None, torch.Generator().manual_seed(2))
    assert set(again) == {"latent", *(f"noise{i}" for i in range(17))}
    for i in range(17):
        r = 2 ** ((i + 5) // 2)
        assert again[f"noise{i}"].shape == (1, 1, r, r)
        assert torch.equal(again[f"noise{i}"], ctx[f"noise{i}"])
    other = g.context(ctx["latent"], None, torch.Generator().manual_seed(3))
    assert not torch.equal(other["noise0"], ctx["noise0"])
    with pytest.raises(ValueError, match=r"W\+ of shape \(N, 18, 512\)"):
        g.context(torch.zeros(1, 512), None, torch.Generator())


# ---------------------------------------------------------------- small generators
def test_cutting_the_chain_changes_nothing_at_every_stage():
    g = tiny()
    z = g.sample_latent(2, torch.Generator().manual_seed(0))
    ctx = g.context(z, None, torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = g(z, generator=torch.Generator().manual_seed(1))
        assert full.shape == (2, 3, 32, 32)
        for k in range(g.num_blocks + 1):
            assert torch.equal(g.synthesize(g.features(ctx, k), ctx, k), full), k


def test_real_architecture_at_32_pixels_runs():
    torch.manual_seed(0)
    g = StyleGAN2.build(StyleGAN2.Settings(size=32, gaussian_fit_samples=64))
    assert g.latent_shape == (8, 512) and g.num_blocks == 4
    z = g.sample_latent(1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        x = g(z)
    assert x.shape == (1, 3, 32, 32) and torch.isfinite(x).all()


def test_gradients_reach_the_latent_the_noise_and_the_features():
    g = tiny()
    z = g.sample_latent(2, torch.Generator().manual_seed(0)).requires_grad_(True)
    ctx = g.context(z, None, torch.Generator().manual_seed(1))
    ctx["noise3"].requires_grad_(True)
    k = 2
    h = g.features(ctx, k).detach().requires_grad_(True)
    g.synthesize(h, ctx, k).square().mean().backward()
    for grad in (z.grad, ctx["noise3"].grad, h.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # from stage k on, only W+ rows 2k-1 onwards are read (rosinality's latent index)
    assert torch.equal(z.grad[:, : 2 * k - 1], torch.zeros_like(z.grad[:, : 2 * k - 1]))
    assert (z.grad[:, 2 * k - 1 :].abs().sum(-1) > 0).all()


def test_block_rejects_a_wrong_input():
    g = tiny()
    ctx = g.context(g.sample_latent(1, torch.Generator()), None, torch.Generator())
    with pytest.raises(ValueError, match=r"block 1 takes \(N, 19, 4, 4\)"):
        g.block(1, torch.zeros(1, 16, 4, 4), ctx)


# ---------------------------------------------------------------- the layers by hand
def test_equalized_lr_mapping_layer():
    g = tiny()
    layer = g.style[1]
    x = torch.randn(5, 32)
    w = layer.weight * 0.01 / math.sqrt(32)
    expected = F.leaky_relu(x @ w.T + layer.bias * 0.01, 0.2) * math.sqrt(2)
    torch.testing.assert_close(layer(x), expected)
    z = torch.randn(5, 32)
    normed = z / z.square().mean(1, keepdim=True).sqrt()
    torch.testing.assert_close(g.mapping(z), g.style[2](g.style[1](normed)))


def _demodulated(conv, w, demodulate=True):
    """Each sample's effective weight, written out: scale * W * style, normalised per output."""
    style = w @ (conv.modulation.weight / math.sqrt(w.shape[1])).T + conv.modulation.bias
    c_in, k = conv.weight.shape[2], conv.weight.shape[3]
    weight = conv.weight[0] / math.sqrt(c_in * k * k) * style[:, None, :, None, None]
    if demodulate:
        weight = weight / (weight.square().sum((2, 3, 4), keepdim=True) + 1e-8).sqrt()
    return weight  # (n, c_out, c_in, k, k)


def test_modulated_conv_equals_per_sample_conv_with_the_demodulated_weight():
    g = tiny()
    x, w = torch.randn(3, 16, 8, 8), torch.randn(3, 32)
    conv = g.convs[1].conv  # 3x3, demodulated, no resampling
    ref = torch.cat(
        [F.conv2d(x[i : i + 1], wi, padding=1) for i, wi in enumerate(_demodulated(conv, w))]
    )
    torch.testing.assert_close(conv(x, w), ref, rtol=1e-4, atol=1e-5)
    rgb = g.to_rgbs[0].conv  # 1x1, not demodulated
    ref = torch.cat(
        [F.conv2d(x[i : i + 1], wi) for i, wi in enumerate(_demodulated(rgb, w, False))]
    )
    torch.testing.assert_close(rgb(x, w), ref, rtol=1e-4, atol=1e-5)


def test_upsampling_conv_is_transposed_conv_then_blur():
    g = tiny()
    x, w = torch.randn(2, 16, 4, 4), torch.randn(2, 32)
    conv = g.convs[0].conv
    blur = torch.tensor([1.0, 3.0, 3.0, 1.0])
    blur = (blur[:, None] * blur[None, :] / 16).expand(16, 1, 4, 4)  # sums to 4 = factor**2
    ref = []
    for i, wi in enumerate(_demodulated(conv, w)):
        y = F.conv_transpose2d(x[i : i + 1], wi.transpose(0, 1), stride=2)  # 9x9
        ref.append(F.conv2d(F.pad(y, (1, 1, 1, 1)), blur, groups=16))  # back to 8x8
    out = conv(x, w)
    assert out.shape == (2, 16, 8, 8)
    torch.testing.assert_close(out, torch.cat(ref), rtol=1e-4, atol=1e-5)


def test_skip_upsampling_by_hand():
    g = tiny()
    up = g.to_rgbs[0].upsample
    taps = torch.tensor([1.0, 3.0, 3.0, 1.0]) / 8
    kernel = taps[:, None] * taps[None, :] * 4
    impulse = torch.zeros(1, 1, 4, 4)
    impulse[0, 0, 0, 0] = 1.0
    out = up(impulse)
    assert out.shape == (1, 1, 8, 8)
    torch.testing.assert_close(out[0, 0, :3, :3], kernel[1:, 1:])  # pad 2 before, 1 after
    assert out[0, 0, 3:].abs().sum() == 0 and out[0, 0, :, 3:].abs().sum() == 0
    flat = up(torch.ones(1, 3, 6, 6))  # a constant stays constant away from the border
    torch.testing.assert_close(flat[:, :, 2:-2, 2:-2], torch.ones(1, 3, 8, 8))
    # a true convolution (the kernel flipped), as upfirdn2d: an impulse gives the kernel back
    k = torch.arange(16.0).view(4, 4)
    torch.testing.assert_close(upfirdn2d(impulse, k, pad=(3, 3))[0, 0, :4, :4], k)


def test_block_wiring_by_hand():
    """conv -> + strength * noise -> + bias -> leaky ReLU * sqrt(2), twice; ToRGB adds its bias
    and the upsampled skip; W+ rows 2k-1, 2k, 2k+1 and noise maps 2k-1, 2k."""
    g = tiny()
    z = g.sample_latent(2, torch.Generator().manual_seed(0))
    ctx = g.context(z, None, torch.Generator().manual_seed(1))

    def styled(layer, x, row, noise):
        y = layer.conv(x, z[:, row]) + layer.noise.weight * ctx[noise]
        return F.leaky_relu(y + layer.activate.bias.view(1, -1, 1, 1), 0.2) * math.sqrt(2)

    with torch.no_grad():
        h0 = g.head(ctx)
        x = styled(g.conv1, h0[:, :-3], 0, "noise0")
        rgb = g.to_rgb1.conv(x, z[:, 1]) + g.to_rgb1.bias
        torch.testing.assert_close(g.block(0, h0, ctx), torch.cat([x, rgb], 1))
        k = 2
        h = g.features(ctx, k)
        x = styled(g.convs[2 * k - 2], h[:, :-3], 2 * k - 1, f"noise{2 * k - 1}")
        x = styled(g.convs[2 * k - 1], x, 2 * k, f"noise{2 * k}")
        rgb = g.to_rgbs[k - 1]
        skip = rgb.conv(x, z[:, 2 * k + 1]) + rgb.bias + rgb.upsample(h[:, -3:])
        torch.testing.assert_close(g.block(k, h, ctx), torch.cat([x, skip], 1))
        assert torch.equal(
            g.to_image(g.features(ctx, g.num_blocks), ctx),
            g(z, generator=torch.Generator().manual_seed(1)),
        )


# ---------------------------------------------------------------- latents
def test_sample_latent_follows_the_gaussian_fit(big):
    g = big[0]
    a = g.sample_latent(3, torch.Generator().manual_seed(5))
    b = g.sample_latent(3, torch.Generator().manual_seed(5))
    c = g.sample_latent(3, torch.Generator().manual_seed(6))
    assert a.shape == (3, 18, 512) and torch.isfinite(a).all()
    assert torch.equal(a, b) and not torch.equal(a, c)
    mean, std = g.gaussian_fit()
    assert g.gaussian_fit()[0] is mean  # cached
    assert mean.shape == std.shape == (512,) and (std > 0).all()
    # the fit inverts the mapping's last leaky ReLU: lrelu(mean) is close to the mapped mean
    w = g.mapping(torch.randn(2000, 512, generator=torch.Generator().manual_seed(9)))
    pre = torch.where(w < 0, w / 0.2, w)
    error = (pre.mean(0) - mean).abs() / std  # in std units; standard error about 0.025
    assert error.max() < 0.15, error.max()
    assert ((pre.std(0) / std - 1).abs() < 0.15).all()
    # and sample_latent draws from it: lrelu(std * N(0, 1) + mean)
    drawn = g.sample_latent(100, torch.Generator().manual_seed(7)).reshape(-1, 512)
    drawn = torch.where(drawn < 0, drawn / 0.2, drawn)
    assert ((drawn.mean(0) - mean).abs() / std).max() < 0.15
    assert ((drawn.std(0) / std - 1).abs() < 0.15).all()
    assert g.mean_latent(64, torch.Generator().manual_seed(0)).shape == (1, 512)


def test_gaussian_fit_is_recomputed_for_new_weights():
    g = tiny(0)
    before = g.gaussian_fit()[0]
    g.load_state_dict(tiny(1).state_dict())
    assert not torch.equal(g.gaussian_fit()[0], before)


# ---------------------------------------------------------------- checkpoints
def test_load_round_trip_at_1024(big, tmp_path):
    g, ctx, hs, _ = big
    path = tmp_path / "stylegan2-ffhq-config-f.pt"
    torch.save({"g_ema": g.state_dict(), "latent_avg": torch.zeros(512)}, path)
    loaded = StyleGAN2.load(StyleGAN2.Settings(), path, "stylegan2")
    for (ka, va), (kb, vb) in zip(g.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb), ka
    with torch.no_grad():
        assert torch.equal(loaded.features(ctx, 4), hs[4])


def test_load_accepts_a_bare_state_dict(tmp_path):
    g = tiny()
    torch.save(g.state_dict(), tmp_path / "g.pt")
    loaded = StyleGAN2.load(TINY, tmp_path / "g.pt", "stylegan2")
    z = g.sample_latent(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(z), g(z))


def test_load_names_missing_and_misshapen_keys(tmp_path):
    state = tiny().state_dict()
    del state["convs.2.conv.modulation.bias"]
    state["to_rgbs.1.bias"] = torch.zeros(1, 4, 1, 1)
    state["extra.weight"] = torch.zeros(1)
    torch.save({"g_ema": state}, tmp_path / "bad.pt")
    with pytest.raises(WeightsError) as err:
        StyleGAN2.load(TINY, tmp_path / "bad.pt", "stylegan2")
    message = str(err.value)
    assert "missing keys (1): convs.2.conv.modulation.bias" in message
    assert "to_rgbs.1.bias (1, 4, 1, 1) (needs (1, 3, 1, 1))" in message
    assert "unexpected keys (1): extra.weight" in message
    assert "key 'g_ema'" in message and "rosinality/stylegan2-pytorch" in message


def test_load_refuses_what_is_not_a_state_dict(tmp_path):
    torch.save({"g": {"x": "not a tensor"}}, tmp_path / "other.pt")
    with pytest.raises(WeightsError, match=r"holds no generator state dict.*key 'g_ema'"):
        StyleGAN2.load(TINY, tmp_path / "other.pt", "stylegan2")
    torch.save(
        {"g_ema": tiny().state_dict(), "args": argparse.Namespace(size=32)}, tmp_path / "a.pt"
    )
    with pytest.raises(WeightsError, match="weights_only=True"):
        StyleGAN2.load(TINY, tmp_path / "a.pt", "stylegan2")
