"""Soteria's properties: it zeroes exactly the classifier columns of the features with the lowest
‖∂r_f/∂X‖/(r_f + ε), as the official code's per-feature loop picks them, and nothing else; both
ways of taking the derivatives agree; the model, its buffers and the inputs stay untouched."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradinv.defenses import build_defense, gradients_of
from gradinv.defenses.soteria import feature_ratios
from gradinv.models import build_model, classifier_layer
from gradinv.protocol import ModelSpec
from gradinv.settings import ConfigError

MODELS = {
    "cnn3": {},
    "lenet": {},
    "convnet": {"width": 16},
    "resnet18": {"width": 16},
}


def case(name, train=False, seed=0):
    model = build_model(ModelSpec(name, 10, 3, 16, MODELS[name]), seed=0).train(train)
    g = torch.Generator().manual_seed(seed)
    return model, torch.randn(3, 3, 16, 16, generator=g), torch.tensor([1, 7, 3])


def soteria(**settings):
    return build_defense("soteria", settings, where="test")


def share(defense, model, x, y):
    return defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))


def reference(model, x, y, epsilon, prune):
    """The official code's computation, with plain autograd on one forward pass: the gradient,
    the ratio of every feature (one backward per feature) and the code's 0/1 mask."""
    _, fc = classifier_layer(model)
    seen = []
    hook = fc.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    x = x.clone().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    hook.remove()
    named = [(n, p) for n, p in model.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in named], retain_graph=True)
    r = seen[0]
    ratio = torch.zeros_like(r)
    onehot = torch.zeros_like(r)
    for f in range(r.shape[1]):
        onehot[:, f] = 1
        (dx,) = torch.autograd.grad(r, x, onehot, retain_graph=True)
        ratio[:, f] = dx.flatten(1).norm(dim=1) / (r[:, f].detach() + epsilon)
        onehot[:, f] = 0
    total = ratio.sum(dim=0).numpy()
    threshold = np.percentile(total, 100 * prune)
    mask = np.where(np.abs(total) < threshold, 0, 1).astype(np.float32)
    return dict(zip([n for n, _ in named], grads, strict=True)), total, torch.from_numpy(mask)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", list(MODELS))
def test_zeroes_exactly_the_columns_of_the_lowest_ratios(name, train):
    model, x, y = case(name, train)
    fc_name, _ = classifier_layer(model)
    weight = f"{fc_name}.weight"
    # 0.6 (the GS README's rate): above the share of dead ReLU features, whose ratios are all 0
    plain, total, mask = reference(copy.deepcopy(model), x, y, 1e-10, 0.6)
    pruned = mask == 0
    assert 0 < int(pruned.sum()) < len(mask)
    assert total[pruned.numpy()].max() < total[~pruned.numpy()].min()  # the lowest ratios
    for derivatives in ("batched", "per_feature"):
        defense = soteria(prune=0.6, derivatives=derivatives)
        shared = share(defense, copy.deepcopy(model), x, y)
        assert defense.last == {
            "pruned_features": int(pruned.sum()),
            "features": len(mask),
            "zero_ratio_features": int((total == 0).sum()),
        }
        torch.testing.assert_close(shared[weight], plain[weight] * mask, rtol=0, atol=0)
        assert shared.keys() == plain.keys()
        for n in plain:
            if n != weight:  # the bias and every other layer: the plain gradient
                torch.testing.assert_close(shared[n], plain[n], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["convnet", "resnet18"])
def test_batched_and_per_feature_give_the_same_ratios(name):
    model, x, y = case(name, train=True)
    _, fc = classifier_layer(model)
    _, total, _ = reference(copy.deepcopy(model), x, y, 0.1, 0.1)
    batched = feature_ratios(model, fc, x, 0.1, batched=True)
    looped = feature_ratios(model, fc, x, 0.1, batched=False)
    torch.testing.assert_close(batched, looped, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(looped, torch.from_numpy(total), rtol=1e-5, atol=1e-6)


def test_the_model_its_buffers_and_the_inputs_move_as_without_the_defense():
    model, x, y = case("resnet18", train=True)
    defended, undefended = copy.deepcopy(model), copy.deepcopy(model)
    share(soteria(derivatives="batched"), defended, x, y)
    gradients_of(undefended, x, y, F.cross_entropy)  # one forward: running statistics move once
    after = undefended.state_dict()
    assert all(torch.equal(b, after[n]) for n, b in defended.state_dict().items())
    before = model.state_dict()
    assert any(not torch.equal(b, before[n]) for n, b in defended.state_dict().items())
    assert defended.training and not x.requires_grad and x.grad is None
    assert all(p.grad is None for p in defended.parameters())


def test_dropout_draws_the_same_masks_for_the_gradient_and_the_ratios():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Dropout(0.5), nn.Linear(196, 5)
    ).train()
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([0, 4])
    torch.manual_seed(1)
    plain, _, mask = reference(copy.deepcopy(model), x, y, 1e-10, 0.5)
    after_reference = torch.rand(1)
    torch.manual_seed(1)
    shared = share(soteria(prune=0.5), model, x, y)
    assert torch.equal(torch.rand(1), after_reference)  # the random state moved as by one pass
    torch.testing.assert_close(shared["4.weight"], plain["4.weight"] * mask, rtol=0, atol=0)


def test_dead_features_take_the_pruning_budget_as_in_the_code():
    """One image through the ReLU CNN: over 10% of r is 0, so the 10th percentile of the ratios
    is 0, nothing lies below it and nothing is pruned (the code's np.percentile rule)."""
    model, x, y = case("cnn3")
    defense = soteria(prune=0.1)
    shared = share(defense, copy.deepcopy(model), x[:1], y[:1])
    plain = gradients_of(model, x[:1], y[:1], F.cross_entropy)
    assert defense.last["zero_ratio_features"] > 0.1 * defense.last["features"]
    assert defense.last["pruned_features"] == 0
    assert all(torch.equal(shared[n], plain[n]) for n in plain)


def test_with_dead_features_excluded_the_live_ones_are_pruned():
    """``dead_features: excluded``: the percentile over the non-zero ratios, so prune 10% of the
    live features; the dead ones' columns stay zero as they were."""
    model, x, y = case("cnn3")
    defense = soteria(prune=0.1, dead_features="excluded")
    shared = share(defense, copy.deepcopy(model), x[:1], y[:1])
    plain = gradients_of(model, x[:1], y[:1], F.cross_entropy)
    _, total, _ = reference(model, x[:1], y[:1], 1e-10, 0.1)
    live = total != 0
    threshold = np.percentile(total[live], 10)
    expected = torch.from_numpy((~live | (total >= threshold)).astype(np.float32))
    assert defense.last["pruned_features"] == int((live & (total < threshold)).sum()) > 0
    torch.testing.assert_close(shared["7.weight"], plain["7.weight"] * expected, rtol=0, atol=0)
    assert all(torch.equal(shared[n], plain[n]) for n in plain if n != "7.weight")


def test_prune_zero_shares_the_plain_gradient():
    model, x, y = case("resnet18", train=True)
    defense = soteria(prune=0.0)
    shared = share(defense, copy.deepcopy(model), x, y)
    plain = gradients_of(copy.deepcopy(model), x, y, F.cross_entropy)
    assert all(torch.equal(shared[n], plain[n]) for n in plain)
    assert defense.last["pruned_features"] == 0


@pytest.mark.parametrize(("name", "epsilon"), [("lenet", 0.0), ("resnet18", 0.1)])
def test_epsilon_variants_follow_the_code(name, epsilon):
    """ε = 0 (DLG notebook, on its sigmoid LeNet) and ε = 0.1 (GS code) as the loop computes."""
    model, x, y = case(name)
    fc_name, _ = classifier_layer(model)
    plain, _, mask = reference(copy.deepcopy(model), x, y, epsilon, 0.2)
    shared = share(soteria(prune=0.2, epsilon=epsilon), model, x, y)
    torch.testing.assert_close(shared[f"{fc_name}.weight"], plain[f"{fc_name}.weight"] * mask)


def test_a_zero_ratio_denominator_is_an_error():
    model, x, y = case("cnn3")  # ReLU: dead features have r_f = 0
    with pytest.raises(ValueError, match="epsilon > 0"):
        share(soteria(epsilon=0.0), model, x, y)


def test_errors_are_clear():
    model, x, y = case("cnn3")
    with pytest.raises(TypeError, match="shared_update"):
        soteria().transform(gradients_of(model, x, y, F.cross_entropy), torch.Generator())
    convs = nn.Sequential(nn.Conv2d(3, 10, 16), nn.Flatten())
    with pytest.raises(ValueError, match="no fully connected layer"):
        share(soteria(), convs, x, y)
    model[-1].weight.requires_grad_(False)
    with pytest.raises(ValueError, match="not trainable"):
        share(soteria(), model, x, y)
    for bad in ({"prune": 1.5}, {"epsilon": -1.0}):
        with pytest.raises(ConfigError):
            soteria(**bad)


@pytest.mark.parametrize("mode", ["configured", "estimated"])
def test_the_attacker_zeroes_the_columns_the_shared_update_zeroes(mode):
    model, x, y = case("resnet18")
    defense = soteria(prune=0.25)
    shared = share(defense, model, x, y)
    dummy = {n: torch.randn(2, *g.shape) for n, g in shared.items()}  # two stacked restarts
    out = defense.attacker_transform(shared, mode)(dummy)
    zero = shared["fc.weight"].eq(0).all(dim=0)
    assert int(zero.sum()) == defense.last["pruned_features"]
    assert torch.equal(out["fc.weight"], dummy["fc.weight"] * ~zero)
    assert all(torch.equal(out[n], dummy[n]) for n in dummy if n != "fc.weight")
    convs_only = {n: g for n, g in shared.items() if g.ndim != 2}
    assert defense.attacker_transform(convs_only, mode)(dummy) is dummy
