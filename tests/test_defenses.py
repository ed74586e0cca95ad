import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gradinv.defenses import DEFENSES, build_defense, gradients_of
from gradinv.defenses.sparsification import percentile_mask, top_k_mask
from gradinv.models import build_model
from gradinv.protocol import ModelSpec

SPEC = ModelSpec("cnn3", num_classes=5, in_channels=3, image_size=16, settings={})
# Settings that keep the defenses with an inner search (Refiner, DCS²) to a few steps here.
FEW_STEPS = {"refiner": {"iterations": 2}, "dcs2": {"iterations": 2}}


def _defense(kind, settings=None, **kwargs):
    """``kind`` as the stages build it: with the data's normalization and, for Refiner, a small
    evaluation network (random weights: the checks here hold for any differentiable one)."""
    from gradinv.metrics.evaluation_network import EvaluationNetwork

    network = None
    if DEFENSES.get(kind).needs_evaluation_network:
        torch.manual_seed(0)
        network = EvaluationNetwork(3, 16, width=4).eval().requires_grad_(False)
    return build_defense(
        kind,
        {**FEW_STEPS.get(kind, {}), **(settings or {})},
        where=f"defenses.{kind}",
        normalization=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
        evaluation_network=network,
        **kwargs,
    )


def _setup(kind="none", settings=None):
    """A 3-layer CNN (extended by ``kind`` if it is architectural), a batch and its labels."""
    spec = SPEC
    if DEFENSES.get(kind).architectural:
        spec = dataclasses.replace(SPEC, extension={"kind": kind, "settings": settings or {}})
    model = build_model(spec, seed=0)
    x, y = torch.randn(3, 3, 16, 16), torch.tensor([0, 1, 4])
    return model, x, y


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_keeps_names_shapes_and_dtypes(kind):
    model, x, y = _setup(kind)
    defense = _defense(kind, update_lr=0.1)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(shared) == names
    for n, p in model.named_parameters():
        assert shared[n].shape == p.shape and shared[n].dtype == p.dtype
        assert torch.isfinite(shared[n]).all()


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_is_deterministic_given_the_generator(kind):
    model, x, y = _setup(kind)
    defense = _defense(kind, update_lr=0.1)
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


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("kind", DEFENSES.available())
def test_every_defense_resumes_with_what_it_kept(kind):
    """FL training saves a client's defense state with its progress: a fresh defense given it
    holds the same state and counts on from the same statistics (CENSOR's fallbacks, DP-SGD's
    clipped examples), so a resumed run's summary counts every round."""
    model, x, y = _setup(kind)
    defense = _defense(kind, update_lr=0.1)
    for seed in (1, 2):
        defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(seed))
    fresh = _defense(kind, update_lr=0.1)
    fresh.load_state_dict(defense.state_dict())
    assert _same(fresh.state_dict(), defense.state_dict())
    assert getattr(fresh, "stats", None) == getattr(defense, "stats", None)
    if kind in ("censor", "dp_sgd"):
        assert fresh.stats["updates"] == 2


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
        kept = shared[n] != 0
        # 70% of the entries survive (fewer only where the gradient itself is zero) ...
        assert kept.sum().item() == min(round(0.7 * g.numel()), (g != 0).sum().item())
        # ... unchanged, and they are the largest: none kept is smaller than one zeroed
        assert torch.equal(shared[n][kept], g[kept])
        if (~kept).any() and kept.any():
            assert g.abs()[kept].min() >= g.abs()[~kept].max()


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


def test_laplace_noise_has_the_configured_scale():
    grads = {"w": torch.zeros(200_000)}
    shared = build_defense("laplace_noise", {"scale": 0.05}, "d").transform(
        grads, torch.Generator().manual_seed(0)
    )["w"]
    # Laplace(0, b): E|x| = b and Var x = 2 b^2
    assert abs(shared.abs().mean().item() - 0.05) < 0.001
    assert abs(shared.var().item() - 2 * 0.05**2) < 2e-4
    assert abs(shared.mean().item()) < 0.001


def test_laplace_noise_is_finite_over_millions_of_draws():
    # An inverse CDF of torch.rand, which returns 0 exactly about once in 2^24 draws (seed 1
    # does within 2^24), drew an infinite value there: FL training diverged within 7 rounds.
    grads = {"w": torch.zeros(1 << 24)}
    shared = build_defense("laplace_noise", {"scale": 0.01}, "d").transform(
        grads, torch.Generator().manual_seed(1)
    )["w"]
    assert torch.isfinite(shared).all() and shared.abs().max() < 1.0


@pytest.mark.parametrize("kind", ["gaussian_noise", "laplace_noise"])
def test_noise_samples_for_eot_stay_differentiable(kind):
    g = torch.zeros(5, requires_grad=True)
    drawn = build_defense(kind, {}, "d").attacker_samples({"w": g}, 3, torch.Generator())
    assert drawn["w"].shape == (3, 5)
    drawn["w"].sum().backward()
    assert torch.equal(g.grad, torch.full((5,), 3.0))


@pytest.mark.parametrize("bits", [1, 2, 3, 8])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_quantized_tensors_take_at_most_two_to_the_bits_values(bits, rounding):
    model, x, y = _setup()
    true = gradients_of(model, x, y, F.cross_entropy)
    defense = build_defense("quantization", {"bits": bits, "rounding": rounding}, "d")
    shared = defense.transform(true, torch.Generator().manual_seed(0))
    for n, g in true.items():
        assert shared[n].unique().numel() <= 2**bits
        assert shared[n].min() == g.min() and shared[n].max() == g.max()  # the range is kept
        step = (g.max() - g.min()).double() / (2**bits - 1)
        error = (shared[n] - g).abs().max().item()
        assert error <= (0.5 if rounding == "nearest" else 1.0) * step.item() * (1 + 1e-6)


def test_thirty_two_bit_quantization_keeps_a_float32_gradient():
    g = {"w": torch.randn(1000)}
    shared = build_defense("quantization", {"bits": 32}, "d").transform(g, torch.Generator())
    assert torch.allclose(shared["w"], g["w"], atol=1e-6)


def test_stochastic_rounding_is_unbiased():
    g = torch.tensor([0.0, 0.3, 1.0])  # 1 bit: levels 0 and 1; 0.3 rounds up 30% of the time
    defense = build_defense("quantization", {"bits": 1, "rounding": "stochastic"}, "d")
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([defense.transform({"w": g}, gen)["w"] for _ in range(4000)])
    assert abs(draws[:, 1].mean().item() - 0.3) < 0.03
    assert defense.randomized and not build_defense("quantization", {}, "d").randomized


def test_the_attacker_quantizes_straight_through():
    defense = build_defense("quantization", {"bits": 2}, "d")
    view = defense.attacker_transform({}, "configured")
    g = torch.linspace(0, 1, 7, requires_grad=True)
    out = view({"w": g})["w"]
    assert out.unique().numel() <= 4
    out.sum().backward()
    assert torch.equal(g.grad, torch.ones(7))


BOTTLENECKS = [
    ("precode", {}, "cnn3", {}),
    ("precode", {"kl": "paper"}, "resnet18", {"width": 8}),
    ("cvb", {}, "cnn3", {}),
    ("cvb", {"kl": "paper"}, "lenet", {}),
    ("cvb", {}, "resnet18", {"width": 8, "norm": "group"}),
    (
        "cvb",
        {"beta": 1e-3, "kernel_size": 3},
        "vit",
        {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "mlp_dim": 32, "patch_size": 4},
    ),
    (
        "precode",
        {"size": 32},
        "vit",
        {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "mlp_dim": 32, "patch_size": 4},
    ),
]


@pytest.mark.parametrize(("kind", "settings", "model", "model_settings"), BOTTLENECKS)
def test_a_bottleneck_keeps_the_shape_and_its_kl_is_positive_and_falls(
    kind, settings, model, model_settings
):
    from gradinv.defenses.bottleneck import VariationalBottleneck
    from gradinv.models import auxiliary_loss

    # beta 1: the KL's weight lets it count against the cross-entropy on one fixed batch (with
    # the defaults, a model that memorises four images gains more than the KL costs)
    settings = {**settings, "beta": 1.0}
    extension = {"kind": kind, "settings": settings}
    spec = ModelSpec(model, 5, 3, 16, model_settings, extension=extension)
    net = build_model(spec, seed=0)
    plain = build_model(dataclasses.replace(spec, extension=None), seed=0)
    (vb,) = [m for m in net.modules() if isinstance(m, VariationalBottleneck)]
    seen = []
    vb.register_forward_hook(lambda _m, args, out: seen.append((args[0].shape, out.shape)))
    x, y = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    assert net(x).shape == plain(x).shape == (4, 5)
    assert seen[0][0] == seen[0][1]  # the bottleneck's output has its input's shape
    defense = build_defense(kind, settings, "d")
    kls = []
    for step in range(40):
        grads = defense.shared_update(
            net, x, y, F.cross_entropy, torch.Generator().manual_seed(step)
        )
        with torch.no_grad():
            net(x)
            kls.append(float(auxiliary_loss(net)) / vb.beta)
            for n, p in net.named_parameters():
                p -= 0.002 * grads[n]
    assert min(kls) > 0
    assert sum(kls[-5:]) < sum(kls[:5])  # training lowers the KL term


def test_the_bottleneck_draws_anew_in_every_pass_and_its_gradient_includes_the_kl():
    from gradinv.models import auxiliary_loss

    model, x, y = _setup("cvb")
    model.eval()  # the draw happens in eval mode too, as in the PRECODE and CVB code
    assert not torch.equal(model(x), model(x))
    auxiliary_loss(model)
    defense = build_defense("cvb", {}, "d")
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    with torch.random.fork_rng():
        torch.manual_seed(
            int(torch.randint(2**62, (1,), generator=torch.Generator().manual_seed(0)))
        )
        ce = F.cross_entropy(model(x), y)
        kl = auxiliary_loss(model)
        params = [p for _, p in model.named_parameters()]
        expected = torch.autograd.grad(ce + kl, params)
    for (n, _), g in zip(model.named_parameters(), expected, strict=True):
        assert torch.allclose(shared[n], g)
    assert kl > 0


def test_an_extended_model_is_what_the_server_sends_and_the_attacker_rebuilds():
    from gradinv.protocol import ServerMessage

    model, _, _ = _setup("precode")
    spec = dataclasses.replace(SPEC, extension={"kind": "precode", "settings": {}})
    msg = ServerMessage.from_dict(ServerMessage(spec, model.state_dict(), 0).to_dict())
    rebuilt = build_model(msg.model)
    rebuilt.load_state_dict(msg.state)  # the same parameter names: the attacker's copy loads
    assert any("encoder" in n for n, _ in rebuilt.named_parameters())


def test_a_cvb_on_a_transformer_needs_a_square_hidden_size():
    spec = ModelSpec(
        "vit",
        5,
        3,
        16,
        {"hidden_dim": 24, "num_heads": 2, "num_layers": 1},
        extension={"kind": "cvb", "settings": {}},
    )
    with pytest.raises(ValueError, match="not a square"):
        build_model(spec)


def test_a_bottleneck_at_an_unknown_position_names_the_modules():
    spec = dataclasses.replace(SPEC, extension={"kind": "cvb", "settings": {"position": "nope"}})
    with pytest.raises(ValueError, match="has no module 'nope'; its modules are: 0, 1"):
        build_model(spec)
