import pytest
import torch

from gradinv.models import MODELS, build_model, classifier_layer
from gradinv.protocol import ModelSpec


@pytest.mark.parametrize("name", MODELS.available())
@pytest.mark.parametrize("channels", [1, 3])
def test_every_model_classifies_small_images(name, channels):
    spec = ModelSpec(
        name,
        num_classes=7,
        in_channels=channels,
        image_size=32,
        settings={"width": 8} if name in ("resnet18", "convnet") else {},
    )
    model = build_model(spec, seed=0).eval()
    out = model(torch.rand(2, channels, 32, 32))
    assert out.shape == (2, 7)
    fc_name, fc = classifier_layer(model)
    assert fc.out_features == 7 and fc_name


@pytest.mark.parametrize("name", MODELS.available())
def test_seeded_initialisation_is_reproducible(name):
    spec = ModelSpec(name, 10, 3, 32, {"width": 8} if name in ("resnet18", "convnet") else {})
    a, b, c = build_model(spec, seed=1), build_model(spec, seed=1), build_model(spec, seed=2)
    for (_, pa), (_, pb), (_, _pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True
    ):
        assert torch.equal(pa, pb)
    assert any(
        not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=False)
    )


def test_resnet_small_image_stem_keeps_resolution():
    spec = ModelSpec("resnet18", 10, 3, 32, {"small_image_stem": True, "width": 8})
    model = build_model(spec, seed=0)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert model.fc.in_features == 64  # 8 * width


def test_unknown_model_setting_names_the_key():
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match=r"models.resnet18.widht: unknown key; did you mean"):
        build_model(ModelSpec("resnet18", 10, 3, 32, {"widht": 8}))


def test_the_vit_has_a_second_derivative_for_gradient_matching():
    """A gradient-matching attack differentiates the model's gradient; the fused CPU attention
    kernel has no second derivative, so the ViT must run the math kernel."""
    import torch

    from gradinv.models import build_model
    from gradinv.protocol import ModelSpec

    model = build_model(
        ModelSpec(
            "vit", 10, 3, 32, {"num_layers": 1, "hidden_dim": 16, "num_heads": 2, "mlp_dim": 16}
        )
    )
    x = torch.rand(1, 3, 32, 32, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([1]))
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    (dx,) = torch.autograd.grad(sum((g**2).sum() for g in grads), x)
    assert torch.isfinite(dx).all() and dx.abs().sum() > 0
