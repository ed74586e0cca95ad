import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gradinv.defenses import DEFENSES, build_defense, gradients_of
from gradinv.defenses.sparsification import percentile_mask, top_k_mask
from gradinv.models import build_model
from gradinv.protocol import ModelSpec

SPEC = ModelSpec("cnn3", num_classes=5, in_channels=3, image_size=16, settings={})


def _setup():
    model = build_model(SPEC, seed=0)
    x, y = torch.randn(3, 3, 16, 16), torch.tensor([0, 1, 4])
    return model, x, y


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_keeps_names_shapes_and_dtypes(kind):
    model, x, y = _setup()
    defense = build_defense(kind, {}, where=f"defenses.{kind}", update_lr=0.1)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(shared) == names
    for n, p in model.named_parameters():
        assert shared[n].shape == p.shape and shared[n].dtype == p.dtype
        assert torch.isfinite(shared[n]).all()


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_is_deterministic_given_the_generator(kind):
    model, x, y = _setup()
    defense = build_defense(kind, {}, where="d", update_lr=0.1)
    a = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(3))
    b = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(3))
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_settings_are_frozen_and_validated(kind):
    cls = DEFENSES.get(kind)
    settings = cls.Settings()
    if dataclasses.fields(settings):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(settings, dataclasses.fields(settings)[0].name, 1)
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        build_defense(kind, {"no_such_key": 1}, where=f"defenses.{kind}")


def test_no_defense_shares_the_true_gradient():
    model, x, y = _setup()
    true = gradients_of(model, x, y, F.cross_entropy)
    shared = build_defense("none", {}, "d").shared_update(
        model, x, y, F.cross_entropy, torch.Generator()
    )
    assert all(torch.equal(true[n], shared[n]) for n in true)


@pytest.mark.parametrize("bound", [0.01, 0.5, 100.0])
def test_global_clipping_bounds_the_total_norm(bound):
    model, x, y = _setup()
    true = gradients_of(model, x, y, F.cross_entropy)
    shared = build_defense("clipping", {"bound": bound}, "d").transform(true, torch.Generator())
    norm = torch.sqrt(sum(g.pow(2).sum() for g in shared.values()))
    true_norm = torch.sqrt(sum(g.pow(2).sum() for g in true.values()))
    assert norm <= bound * (1 + 1e-5)
    assert torch.isclose(norm, torch.minimum(true_norm, torch.tensor(bound)), rtol=1e-4)
    ratios = {n: (shared[n].norm() / true[n].norm()).item() for n in true if true[n].norm() > 0}
    assert max(ratios.values()) - min(ratios.values()) < 1e-4  # one common scale: direction kept


def test_per_layer_clipping_bounds_each_tensor():
    model, x, y = _setup()
    true = gradients_of(model, x, y, F.cross_entropy)
    shared = build_defense("clipping", {"bound": 0.05, "scope": "per_layer"}, "d").transform(
        true, torch.Generator()
    )
    for n in true:
        assert shared[n].norm() <= 0.05 * (1 + 1e-5)
        assert torch.isclose(
            shared[n].norm(), torch.minimum(true[n].norm(), torch.tensor(0.05)), rtol=1e-4
        )


@pytest.mark.parametrize("prune", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_top_k_keeps_exactly_the_configured_fraction(prune):
    g = torch.randn(1000)
    mask = top_k_mask(g, prune)
    assert mask.sum().item() == round((1 - prune) * 1000)
    if 0 < mask.sum() < 1000:
        assert g.abs()[mask].min() >= g.abs()[~mask].max()


def test_percentile_rule_zeroes_entries_below_the_percentile_as_coded():
    g = torch.arange(1, 101, dtype=torch.float32)  # |g| = 1..100
    mask = percentile_mask(g, 0.2)
    # numpy's 20th percentile of 1..100 is 20.8: entries 1..20 fall below it.
    assert mask.sum().item() == 80 and not mask[:20].any() and mask[20:].all()


def test_sparsification_zeroes_the_smallest_entries_of_every_tensor():
    model, x, y = _setup()
    true = gradients_of(model, x, y, F.cross_entropy)
    shared = build_defense("sparsification", {"prune": 0.3, "rule": "top_k"}, "d").transform(
        true, torch.Generator()
    )
    for n, g in true.items():
        assert (shared[n] != 0).sum().item() <= round(0.7 * g.numel())
        assert torch.equal(shared[n][shared[n] != 0], g[shared[n] != 0])


def test_gaussian_noise_has_the_configured_std():
    grads = {"w": torch.zeros(200_000)}
    shared = build_defense("gaussian_noise", {"std": 0.05}, "d").transform(
        grads, torch.Generator().manual_seed(0)
    )
    assert abs(shared["w"].std().item() - 0.05) < 0.001
    assert abs(shared["w"].mean().item()) < 0.001


def test_negative_noise_std_is_rejected():
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match=r"defenses.noise.std: -0.1 is out of range"):
        build_defense("gaussian_noise", {"std": -0.1}, where="defenses.noise")
