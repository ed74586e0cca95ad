"""DP-SGD's properties: per-example gradients as each example alone, clipped to C, mean plus noise
of std σC/B from the generator, batch-norm buffers untouched, and ε as Opacus accounts it."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn

from gradinv.defenses import build_defense, gradients_of
from gradinv.defenses.base import per_sample_gradients
from gradinv.defenses.dp_sgd import clipped_per_sample_gradients, privacy_spent
from gradinv.models import build_model
from gradinv.protocol import ModelSpec
from gradinv.settings import ConfigError

CNN = ("cnn3", {})
RESNET_GN = ("resnet18", {"width": 8, "norm": "group"})
RESNET_BN = ("resnet18", {"width": 8, "norm": "batch"})


def case(name="cnn3", settings=None, batch=3):
    model = build_model(ModelSpec(name, 5, 3, 16, settings or {}), seed=0)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(batch, 3, 16, 16, generator=g), torch.arange(batch) % 5


def dp_sgd(**settings):
    return build_defense("dp_sgd", settings, where="defenses.dp_sgd")


def share(defense, model, x, y, seed=0):
    return defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(seed))


def total_norms(grads):
    return torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))


class Bottleneck(nn.Module):
    """A toy model with an auxiliary term, stored during its forward as a bottleneck does."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.head = nn.Linear(12, 4), nn.Linear(4, 5)
        self.aux_loss = None

    def forward(self, x):
        h = self.enc(x.flatten(1))
        self.aux_loss = 0.5 * h.pow(2).sum(1).mean()
        return self.head(h)


@pytest.mark.parametrize(
    ("spec", "mode"),
    [(CNN, "eval"), (RESNET_GN, "train"), (RESNET_BN, "eval"), (RESNET_BN, "train")],
    ids=["cnn3", "resnet18-group", "resnet18-batch-eval", "resnet18-batch-train"],
)
def test_per_example_gradients_are_each_example_alone(spec, mode):
    model, x, y = case(*spec)
    # float64: a batch of one through train-mode batch norm differs by float32 rounding (~1e-4)
    model, x = model.double().train(mode == "train"), x.double()
    per = per_sample_gradients(model, x, y, F.cross_entropy)
    for i in range(len(y)):
        # train-mode batch norm: a batch of one, normalized by its own statistics
        alone = gradients_of(copy.deepcopy(model), x[i : i + 1], y[i : i + 1], F.cross_entropy)
        assert per.keys() == alone.keys()
        for n, g in alone.items():
            torch.testing.assert_close(per[n][i], g)


def test_per_example_gradients_include_the_models_auxiliary_term():
    model = Bottleneck()
    x, y = torch.randn(3, 12, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 2, 4])
    per = per_sample_gradients(model, x, y, F.cross_entropy)
    for i in range(3):
        alone = gradients_of(model, x[i : i + 1], y[i : i + 1], F.cross_entropy)
        for n, g in alone.items():
            torch.testing.assert_close(per[n][i], g)
    assert model.aux_loss is None  # read and cleared inside the per-example pass
    task_only = torch.func.grad(
        lambda w: F.cross_entropy(torch.func.functional_call(model, w, (x[:1],)), y[:1])
    )({n: p.detach() for n, p in model.named_parameters()})
    assert not torch.allclose(per["enc.weight"][0], task_only["enc.weight"])


def test_a_model_that_draws_in_its_forward_draws_anew_for_each_example():
    model = nn.Sequential(nn.Linear(12, 8), nn.Dropout(0.5), nn.Linear(8, 5)).train()
    x, y = torch.ones(2, 12), torch.tensor([3, 3])
    per = per_sample_gradients(model, x, y, F.cross_entropy)
    assert not torch.equal(per["0.weight"][0], per["0.weight"][1])


def test_each_example_is_clipped_to_c_and_kept_below_it():
    model, x, y = case(batch=6)
    raw = per_sample_gradients(model, x, y, F.cross_entropy)
    raw_norms = total_norms(raw)
    clip = float(raw_norms.median())  # some examples above, some below
    clipped, norms = clipped_per_sample_gradients(model, x, y, F.cross_entropy, clip)
    torch.testing.assert_close(norms, raw_norms)
    after = total_norms(clipped)
    assert (after <= clip * (1 + 1e-5)).all()
    below, above = raw_norms <= clip, raw_norms > clip
    assert below.any() and above.any()
    torch.testing.assert_close(after[above], torch.full_like(after[above], clip))
    for n, g in raw.items():
        assert torch.equal(clipped[n][below], g[below])
        ratio = clipped[n][above].flatten(1).norm(dim=1) / g[above].flatten(1).norm(dim=1)
        torch.testing.assert_close(ratio, clip / raw_norms[above])  # one scale per example


def test_zero_noise_shares_the_mean_of_the_clipped_gradients():
    model, x, y = case()
    shared = share(dp_sgd(clip=0.5, noise_multiplier=0.0), model, x, y)
    clipped, _ = clipped_per_sample_gradients(model, x, y, F.cross_entropy, 0.5)
    assert shared.keys() == clipped.keys()
    for n, g in clipped.items():
        assert torch.equal(shared[n], g.sum(0) / len(y))
        assert shared[n].dtype == g.dtype and shared[n].shape == g.shape[1:]


def test_the_noise_has_std_sigma_c_over_b():
    model, x, y = case(batch=4)
    sigma, clip = 2.0, 0.5
    shared = share(dp_sgd(clip=clip, noise_multiplier=sigma), model, x, y, seed=5)
    clipped, _ = clipped_per_sample_gradients(model, x, y, F.cross_entropy, clip)
    noise = torch.cat([(shared[n] - g.mean(0)).flatten() for n, g in clipped.items()])
    assert noise.numel() > 50_000
    expected = sigma * clip / len(y)
    assert abs(float(noise.std()) / expected - 1) < 0.02
    assert abs(float(noise.mean())) < 0.02 * expected


def test_the_update_is_fixed_by_the_generator():
    model, x, y = case()
    defense = dp_sgd()
    a, b, c = (share(defense, model, x, y, seed) for seed in (3, 3, 4))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not any(torch.equal(a[n], c[n]) for n in a)


def test_batch_norm_buffers_and_the_model_are_left_unchanged():
    model, x, y = case(*RESNET_BN)
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    defense = dp_sgd()
    _, norms = clipped_per_sample_gradients(model, x, y, F.cross_entropy, defense.settings.clip)
    above = int((norms > defense.settings.clip).sum())  # the same batch, shared twice below
    share(defense, model, x, y)
    share(defense, model, x, y, seed=1)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert defense.stats["updates"] == 2 and defense.stats["examples"] == 6
    assert defense.stats["batch_size"] == 3 and defense.batch_size == 3
    assert defense.stats["clipped"] == 2 * above
    assert defense.last["batch_size"] == 3 and defense.last["max_norm"] > 0


def test_the_attacker_samples_the_noise_of_the_victims_batch_size():
    defense = dp_sgd(clip=0.5, noise_multiplier=2.0)
    grads = {"w": torch.ones(4000, requires_grad=True)}
    with pytest.raises(ValueError, match="batch size"):
        defense.attacker_samples(grads, 2, torch.Generator())
    defense.batch_size = 4
    drawn = defense.attacker_samples(grads, 3, torch.Generator().manual_seed(0))
    assert drawn["w"].shape == (3, 4000)
    assert abs(float((drawn["w"] - 1).detach().std()) / (2.0 * 0.5 / 4) - 1) < 0.03
    drawn["w"].sum().backward()
    assert torch.equal(grads["w"].grad, torch.full((4000,), 3.0))  # differentiable
    assert defense.attacker_transform(grads, "configured") is None


def test_for_a_batch_of_one_the_attacker_applies_the_clip():
    defense = dp_sgd(clip=0.5)
    defense.batch_size = 1
    view = defense.attacker_transform({}, "estimated")
    out = view({"a": torch.full((3,), 1.0), "b": torch.full((1,), 1.0)})
    norm = torch.sqrt(sum(g.pow(2).sum() for g in out.values()))
    torch.testing.assert_close(norm, torch.tensor(0.5))


def test_epsilon_is_what_opacus_accounts_and_moves_the_right_way():
    q, delta = 16 / 320, 1e-5
    stepped = RDPAccountant()
    for _ in range(40):
        stepped.step(noise_multiplier=1.1, sample_rate=q)
    assert privacy_spent(1.1, q, 40, delta) == stepped.get_epsilon(delta=delta)
    prv = PRVAccountant()
    prv.history = [(1.1, q, 40)]
    assert privacy_spent(1.1, q, 40, delta, accountant="prv") == prv.get_epsilon(delta=delta)
    by_sigma = [privacy_spent(s, q, 40, delta) for s in (0.7, 1.0, 2.0, 4.0)]
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 4
    by_steps = [privacy_spent(1.0, q, t, delta) for t in (1, 10, 100, 1000)]
    assert by_steps == sorted(by_steps) and len(set(by_steps)) == 4
    assert privacy_spent(0.0, q, 40, delta) == math.inf
    assert privacy_spent(0.0, q, 40, delta, accountant="prv") == math.inf
    assert privacy_spent(1.0, q, 0, delta) == 0.0


def test_local_steps_on_one_batch_count_as_one_step_of_sigma_over_root_k():
    q, delta = 0.05, 1e-5
    five = privacy_spent(1.0, q, 20, delta, local_steps=5)
    assert five == privacy_spent(1.0 / math.sqrt(5), q, 20, delta)
    assert five > privacy_spent(1.0, q, 100, delta)  # more than 100 independently drawn batches


def test_the_defense_accounts_with_its_own_settings():
    defense = dp_sgd(noise_multiplier=1.3, delta=1e-6, accountant="prv")
    assert defense.epsilon(0.1, 30, local_steps=2) == privacy_spent(
        1.3, 0.1, 30, 1e-6, "prv", local_steps=2
    )
    assert defense.stats["noise_multiplier"] == 1.3 and defense.stats["accountant"] == "prv"


@pytest.mark.parametrize(
    "args",
    [
        (-1.0, 0.1, 10, 1e-5),
        (1.0, 0.0, 10, 1e-5),
        (1.0, 1.5, 10, 1e-5),
        (1.0, 0.1, 10, 1.0),
        (1.0, 0.1, 10, 1e-5, "gdp"),
    ],
)
def test_privacy_spent_refuses_what_it_cannot_account(args):
    with pytest.raises(ValueError, match="privacy_spent"):
        privacy_spent(*args)


@pytest.mark.parametrize("settings", [{"clip": 0.0}, {"noise_multiplier": -0.1}, {"delta": 1.0}])
def test_settings_out_of_range_are_refused(settings):
    with pytest.raises(ConfigError, match=r"defenses\.dp_sgd\..* is out of range"):
        dp_sgd(**settings)
