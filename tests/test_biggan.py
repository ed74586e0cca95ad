"""BigGAN-deep cut into blocks: the real architectures, the package's forward, loading, gradients.

One biggan-deep-256 with random weights (real shapes, ~56M parameters) is built per module and
kept twice: the package's ``BigGAN`` with spectral norm on, and the wrapper with it baked.
"""

import copy
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from pytorch_pretrained_biggan import BigGAN
from pytorch_pretrained_biggan.convert_tf_to_pytorch import BigGAN128, BigGAN256, BigGAN512
from pytorch_pretrained_biggan.model import BigGANBatchNorm, SelfAttn
from torch.nn.utils.spectral_norm import SpectralNorm

from gradinv.generators import GENERATORS, WeightsError, biggan
from gradinv.generators.biggan import BigGANDeep
from gradinv.settings import ConfigError, from_mapping

# Input of block k of biggan-deep-256 (k = 13: of to_image), from Table 8(b) of arXiv:1809.11096:
# two blocks per resolution from 4x4 to 256x256, 16ch -> 1ch (ch = 128), the non-local block
# (block 8) at 64x64.
SHAPES_256 = [
    (2048, 4, 4), (2048, 4, 4), (2048, 8, 8), (2048, 8, 8), (1024, 16, 16), (1024, 16, 16),
    (1024, 32, 32), (1024, 32, 32), (512, 64, 64), (512, 64, 64), (512, 64, 64),
    (256, 128, 128), (256, 128, 128), (128, 256, 256),
]  # fmt: skip


@pytest.fixture(scope="module")
def pair():
    settings = BigGANDeep.Settings()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        package = biggan.package_model(settings.model)
        with torch.no_grad():  # what the package's init leaves trivial, so the tests see it
            for module in package.modules():
                if isinstance(module, SelfAttn):
                    module.gamma.fill_(0.5)  # 0 at init: the attention would be the identity
                if isinstance(module, BigGANBatchNorm):
                    module.running_means.normal_(0.0, 0.1)
                    module.running_vars.uniform_(0.5, 1.5)
        z = torch.randn(1, 128)
    labels = torch.tensor([207])
    wrapper = BigGANDeep(settings, copy.deepcopy(package))
    with torch.no_grad():
        image = wrapper(z, labels)
    return SimpleNamespace(
        settings=settings, package=package, g=wrapper, z=z, labels=labels, image=image
    )


def test_registered_with_bounded_settings():
    assert GENERATORS.get("biggan") is BigGANDeep
    assert from_mapping(BigGANDeep.Settings, {}, "g") == BigGANDeep.Settings(
        model="biggan-deep-256", truncation=1.0
    )
    with pytest.raises(ConfigError, match="truncation"):
        from_mapping(BigGANDeep.Settings, {"truncation": 1.5}, "generators.biggan")
    with pytest.raises(ConfigError, match="biggan-deep-256"):
        biggan.config("biggan-deep-265")


@pytest.mark.parametrize(
    ("model", "converter"),
    [
        ("biggan-deep-128", BigGAN128),
        ("biggan-deep-256", BigGAN256),
        ("biggan-deep-512", BigGAN512),
    ],
)
def test_architectures_are_the_package_converters(model, converter):
    assert biggan.config(model).to_dict() == converter.to_dict()


@pytest.mark.parametrize(
    ("model", "millions", "blocks"),
    [("biggan-deep-128", 50.4, 11), ("biggan-deep-256", 55.9, 13), ("biggan-deep-512", 56.2, 15)],
)
def test_parameter_counts_are_the_published_ones(model, millions, blocks):
    """The package README's counts of the converted TF-Hub models."""
    with torch.device("meta"):
        net = BigGAN(biggan.config(model))
    assert round(sum(p.numel() for p in net.parameters()) / 1e6, 1) == millions
    assert len(net.generator.layers) == blocks


def test_state_dict_has_the_real_keys_and_shapes_then_plain_weights(pair):
    before = pair.package.state_dict()
    for key, shape in {
        "embeddings.weight": (128, 1000),
        "generator.gen_z.weight_orig": (4 * 4 * 16 * 128, 256),
        "generator.gen_z.weight_u": (4 * 4 * 16 * 128,),
        "generator.gen_z.weight_v": (256,),
        "generator.layers.0.bn_0.running_means": (51, 2048),
        "generator.layers.0.bn_0.scale.weight_orig": (2048, 256),
        "generator.layers.8.gamma": (1,),
        "generator.layers.8.snconv1x1_theta.weight_orig": (64, 512, 1, 1),
        "generator.layers.12.conv_1.weight_orig": (64, 64, 3, 3),
        "generator.conv_to_rgb.weight_orig": (128, 128, 3, 3),
        "generator.bn.weight": (128,),
    }.items():
        assert tuple(before[key].shape) == shape, key
    assert len(before) == 602
    assert sum(p.numel() for p in pair.package.parameters()) == 55_880_833

    g = pair.g
    after = g.state_dict()
    assert not [k for k in after if k.endswith(("_orig", "_u", "_v"))]
    assert not [
        m for m in g.modules() for h in m._forward_pre_hooks.values() if isinstance(h, SpectralNorm)
    ]
    assert tuple(after["generator.gen_z.weight"].shape) == (32768, 256)
    assert sum(p.numel() for p in g.parameters()) == 55_880_833
    assert not any(p.requires_grad for p in g.parameters())
    assert (g.latent_shape, g.num_classes, g.resolution, g.num_blocks) == ((128,), 1000, 256, 13)

    # functional_call sees the plain weight (spectral norm's hook would overwrite it).
    gen_z = g.generator.gen_z
    cond = torch.randn(2, 256)
    zeroed = {"weight": torch.zeros_like(gen_z.weight), "bias": gen_z.bias}
    out = torch.func.functional_call(gen_z, zeroed, (cond,))
    assert torch.equal(out, gen_z.bias.expand(2, -1))


@torch.no_grad()
def test_wrapper_is_the_package_forward_with_spectral_norm(pair):
    """Same weights, spectral norm on (package, eval) and baked (wrapper): the same image."""
    one_hot = F.one_hot(pair.labels, 1000).float()
    expected = pair.package(pair.z, one_hot, pair.settings.truncation)
    assert pair.image.shape == (1, 3, 256, 256)
    assert torch.equal(pair.image, expected)


@torch.no_grad()
def test_every_stage_has_the_real_shape_and_resynthesises_the_image(pair):
    g, image = pair.g, pair.image
    assert torch.isfinite(image).all()
    assert image.abs().max() <= 1.0
    assert image.std() > 0.05
    ctx = g.context(pair.z, pair.labels, torch.Generator())
    for k in range(g.num_blocks + 1):
        h = g.features(ctx, k)
        assert tuple(h.shape) == (1, *SHAPES_256[k]), k
        assert torch.equal(g.synthesize(h, ctx, k), image), k
    with pytest.raises(ValueError, match="stage 14"):
        g.features(ctx, 14)


def test_gradients_reach_the_latent_and_an_intermediate_input(pair):
    g = pair.g
    latent = pair.z.clone().requires_grad_(True)
    ctx = g.context(pair.z, pair.labels, torch.Generator())
    ctx["latent"] = latent  # as an attack swaps in its own latent
    h = g.features(ctx, 9)  # through the head, eight GenBlocks and the attention
    h_leaf = h.detach().requires_grad_(True)
    out = g.block(9, h_leaf, ctx)  # reads the latent again, through the conditioning
    (h.square().mean() + out.square().mean()).backward()
    for grad in (latent.grad, h_leaf.grad):
        assert grad is not None
        assert torch.isfinite(grad).all()
        assert grad.abs().sum() > 0


@torch.no_grad()
def test_vmap_over_restarts(pair):
    g = pair.g
    embed = g.context(pair.z, pair.labels, torch.Generator())["embed"]
    latents = torch.randn(2, 1, 128, generator=torch.Generator().manual_seed(1))

    def features(z):
        return g.features({"latent": z, "embed": embed}, 9)

    looped = torch.stack([features(z) for z in latents])
    torch.testing.assert_close(torch.func.vmap(features)(latents), looped)


@torch.no_grad()
def test_context_holds_independent_leaves_that_the_blocks_read(pair):
    """An attack swaps ctx["latent"]: every GenBlock must read it, not a stored copy."""
    g = pair.g
    ctx = g.context(pair.z, pair.labels, torch.Generator())
    assert set(ctx) == {"latent", "embed"}
    assert ctx["latent"] is pair.z
    assert ctx["embed"].is_leaf
    h = g.head(ctx)
    other = {**ctx, "latent": torch.randn(1, 128)}
    assert not torch.equal(g.head(other), h)
    assert not torch.equal(g.block(0, h, other), g.block(0, h, ctx))


def test_context_needs_labels(pair):
    with pytest.raises(ValueError, match="class-conditional"):
        pair.g.context(pair.z, None, torch.Generator())
    with pytest.raises(ValueError, match="class indices"):
        pair.g.context(pair.z, torch.tensor([0.5]), torch.Generator())


@torch.no_grad()
def test_load_round_trips_the_package_state_dict(pair, tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save(pair.package.state_dict(), path)
    loaded = BigGANDeep.load(pair.settings, path, "biggan")
    assert torch.equal(loaded(pair.z, pair.labels), pair.image)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", "missing keys generator.layers.3.conv_1.weight_orig"),
        ("reshape", "embeddings.weight is (1000, 128), expected (128, 1000)"),
        ("add", "unexpected keys generator.extra"),
    ],
)
def test_load_names_the_key_that_does_not_fit(pair, tmp_path, change, message):
    state = dict(pair.package.state_dict())
    if change == "drop":
        del state["generator.layers.3.conv_1.weight_orig"]
    elif change == "reshape":
        state["embeddings.weight"] = state["embeddings.weight"].t().contiguous()
    else:
        state["generator.extra"] = torch.zeros(1)
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    with pytest.raises(WeightsError, match=re.escape(message)):
        BigGANDeep.load(pair.settings, path, "biggan")


@torch.no_grad()
def test_build_128_gives_finite_images():
    """Fresh weights as built (no test adjustments): the forward must stay finite."""
    g = BigGANDeep.build(BigGANDeep.Settings(model="biggan-deep-128"))
    assert (g.resolution, g.num_blocks) == (128, 11)
    x = g(torch.randn(2, 128), torch.tensor([1, 999]))
    assert x.shape == (2, 3, 128, 128)
    assert torch.isfinite(x).all()
    assert x.abs().max() <= 1.0
