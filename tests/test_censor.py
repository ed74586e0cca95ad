"""CENSOR's properties: orthogonal, norm-matched candidates; argmin selection; Algorithm 1's
raw-gradient fallback and the prose's never-raw reading; one model mode for G0 and every loss;
Eq. 11's per-sample subspace; seeded; and the official code's deviations reproduced when asked
for."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gradinv.data.prepared import PreparedDataset, public_pool, public_pool_indices
from gradinv.defenses import build_defense, gradients_of
from gradinv.defenses.base import per_sample_gradients
from gradinv.defenses.censor import CensorFallbackWarning, orthogonal_direction
from gradinv.models import build_model
from gradinv.protocol import ModelSpec


def case(seed=0):
    model = build_model(ModelSpec("cnn3", 10, 3, 16, {}), seed=0)
    g = torch.Generator().manual_seed(seed)
    return model, torch.rand(2, 3, 16, 16, generator=g), torch.tensor([1, 7])


def censor(**settings):
    return build_defense("censor", settings, where="test", update_lr=0.1)


def orthogonal(**settings):
    """CENSOR that always shares an orthogonal candidate (the prose's reading): the tests of the
    candidates' own properties; under Algorithm 1 a fallback would share G0 instead."""
    return censor(fallback="never-raw", **settings)


def share(defense, seed=0, data_seed=0):
    model, x, y = case(data_seed)
    out = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(seed))
    return out, gradients_of(model, x, y, F.cross_entropy), model, x, y


def cos(a, b):
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_exact_projection_is_orthogonal_and_norm_matched_per_layer():
    shared, original, *_ = share(orthogonal(trials=5))
    assert shared.keys() == original.keys()
    for name, g in original.items():
        assert abs(cos(shared[name], g)) < 1e-5, name
        torch.testing.assert_close(shared[name].norm(), g.norm(), rtol=1e-5, atol=1e-12)


def test_whole_model_scope_is_orthogonal_and_norm_matched_as_a_whole():
    shared, original, *_ = share(orthogonal(trials=5, scope="whole-model"))
    flat = lambda d: torch.cat([d[n].reshape(-1) for n in original])  # noqa: E731
    assert abs(cos(flat(shared), flat(original))) < 1e-5
    torch.testing.assert_close(flat(shared).norm(), flat(original).norm(), rtol=1e-5, atol=0)
    per_layer = [abs(cos(shared[n], original[n])) for n in original]
    assert max(per_layer) > 1e-3  # each layer alone is not constrained


def test_the_selected_candidate_has_the_lowest_evaluated_loss():
    defense = orthogonal(trials=8)
    shared, _, model, x, y = share(defense)
    losses = defense.last["losses"]
    assert defense.last["selected"] == min(range(len(losses)), key=losses.__getitem__)
    model.eval()
    moved = {n: p.detach() - 0.1 * shared[n] for n, p in model.named_parameters()}
    with torch.no_grad():
        loss = F.cross_entropy(functional_call(model, moved, (x,)), y)
    assert float(loss) == pytest.approx(min(losses), rel=1e-6)


def test_the_same_seed_gives_the_same_update_and_another_seed_another():
    a, *_ = share(orthogonal(trials=4), seed=3)
    b, *_ = share(orthogonal(trials=4), seed=3)
    c, *_ = share(orthogonal(trials=4), seed=4)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


@pytest.mark.parametrize(
    "settings",
    [{}, {"scope": "whole-model"}, {"subspace": "per-sample"}, {"projection": "as-coded"}],
    ids=["layer-wise", "whole-model", "per-sample", "as-coded"],
)
def test_device_draws_make_candidate_t_from_the_t_th_direction_of_one_draw(settings):
    """draws: device draws each layer's T directions at once and projects them in one vmap
    pass: candidate t is what the one-at-a-time path makes from the t-th directions."""
    trials = 5
    defense = orthogonal(trials=trials, draws="device", **settings)
    model, x, y = case()
    grads = gradients_of(model, x, y, F.cross_entropy)
    basis = defense._basis(model, x, y, F.cross_entropy, grads)
    at_once = defense._candidates_at_once(grads, torch.Generator().manual_seed(2), basis)
    replay = torch.Generator().manual_seed(2)
    if settings.get("scope") == "whole-model":
        flat = torch.randn(trials, sum(g.numel() for g in grads.values()), generator=replay)
        pieces = flat.split([g.numel() for g in grads.values()], dim=1)
        r = {
            n: p.reshape(trials, *g.shape) for (n, g), p in zip(grads.items(), pieces, strict=True)
        }
    else:
        r = {n: torch.randn(trials, *g.shape, generator=replay) for n, g in grads.items()}
    assert all(at_once[n].shape == (trials, *g.shape) for n, g in grads.items())
    for t in range(trials):
        one = defense._candidate(grads, replay, r={n: d[t] for n, d in r.items()}, basis=basis)
        for n in grads:
            torch.testing.assert_close(at_once[n][t], one[n], rtol=1e-5, atol=1e-6)


def test_device_draws_are_seeded_orthogonal_and_other_than_cpu_draws():
    a, original, *_ = share(orthogonal(trials=4, draws="device"), seed=3)
    b, *_ = share(orthogonal(trials=4, draws="device"), seed=3)
    c, *_ = share(orthogonal(trials=4), seed=3)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)  # another order of the same generator
    for name, g in original.items():
        assert abs(cos(a[name], g)) < 1e-5, name
        torch.testing.assert_close(a[name].norm(), g.norm(), rtol=1e-5, atol=1e-12)
        # its own storage: a view of the 4 stacked candidates would be saved with all 4
        assert a[name].untyped_storage().nbytes() == g.numel() * g.element_size(), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_draws_on_a_gpu_are_seeded_and_orthogonal():
    from gradinv.defenses.censor import _draw_generator

    gpu = torch.device("cuda")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    d1, d2 = _draw_generator(g1, gpu, "device"), _draw_generator(g2, gpu, "device")
    assert d1.device.type == "cuda" and d1.initial_seed() == d2.initial_seed()
    grads = {"w": torch.randn(300, 40, device=gpu)}
    defense = censor(trials=3, draws="device")
    out = defense._candidates_at_once(grads, d1, {"w": grads["w"].reshape(-1) / grads["w"].norm()})
    assert out["w"].device.type == "cuda" and all(abs(cos(c, grads["w"])) < 1e-5 for c in out["w"])


def test_as_coded_projection_leaks_on_a_small_norm_layer():
    exact, coded = censor(), censor(projection="as-coded")
    g = {"bias": torch.randn(64, generator=torch.Generator().manual_seed(0)) * 1e-3}
    gen_e, gen_c = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    cos_exact = [abs(cos(exact._candidate(g, gen_e)["bias"], g["bias"])) for _ in range(50)]
    cos_coded = [abs(cos(coded._candidate(g, gen_c)["bias"], g["bias"])) for _ in range(50)]
    assert max(cos_exact) < 1e-5
    assert sum(cos_coded) / 50 > 0.05  # about |r·ĝ| (1 - ‖g‖): roughly 0.1 for 64 entries
    unit = {"bias": g["bias"] / g["bias"].norm()}  # the code is right only when ‖g‖ = 1
    assert abs(cos(coded._candidate(unit, gen_c)["bias"], unit["bias"])) < 1e-5


@pytest.mark.parametrize("draws", ["cpu", "device"])
def test_batched_and_sequential_evaluation_select_the_same_candidate(draws):
    seq = censor(trials=6, evaluation="sequential", draws=draws)
    bat = censor(trials=6, evaluation="batched", draws=draws)
    a, *_ = share(seq)
    b, *_ = share(bat)
    assert seq.last["selected"] == bat.last["selected"]
    torch.testing.assert_close(torch.tensor(seq.last["losses"]), torch.tensor(bat.last["losses"]))
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("fallback", ["algorithm-1", "never-raw"])
def test_the_fallback_when_no_candidate_lowers_the_loss(monkeypatch, fallback):
    defense = censor(trials=3, fallback=fallback)
    real = defense._losses

    def worse(*args):  # every candidate raises the loss
        _, losses = real(*args)
        return losses.min() - 1.0, losses

    monkeypatch.setattr(defense, "_losses", worse)
    if fallback == "algorithm-1":
        with pytest.warns(CensorFallbackWarning, match="raw gradient G0"):
            shared, original, *_ = share(defense)
        assert all(torch.equal(shared[n], original[n]) for n in original)  # lines 11 and 20
        assert defense.last["cosine"] == pytest.approx(1.0)
        assert defense.last["raw_gradient_shared"] and defense.stats["raw_shared"] == 1
    else:
        shared, original, *_ = share(defense)
        assert abs(defense.last["cosine"]) < 1e-4
        assert not defense.last["raw_gradient_shared"] and defense.stats["raw_shared"] == 0
    assert defense.last["fallback_fired"] and defense.stats["fallbacks"] == 1
    assert defense.rates({}) == {
        "fallback_rate": 1.0,
        "raw_gradient_rate": 1.0 if fallback == "algorithm-1" else 0.0,
    }


class Quadratic(nn.Module):
    """A linear least-squares model: a convex loss with a positive-definite Hessian, so every
    step orthogonal to the gradient raises the loss (its first-order term is zero)."""

    def __init__(self, d: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = nn.Parameter(torch.randn(1, d, generator=g))
        self.bias = nn.Parameter(torch.randn(1, generator=g))

    def forward(self, x):
        return x @ self.weight.T + self.bias


def squared_error(out, target):
    return ((out.squeeze(1) - target) ** 2).mean()


def quadratic_case(n=32, d=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g)  # full rank: X^T X is positive definite
    return Quadratic(d), x, torch.randn(n, generator=g)


@pytest.mark.parametrize("fallback", ["algorithm-1", "never-raw"])
def test_a_convex_problem_where_no_orthogonal_step_helps(fallback):
    model, x, y = quadratic_case()
    defense = build_defense("censor", {"trials": 20, "fallback": fallback}, "t", update_lr=0.5)
    grads = gradients_of(model, x, y, squared_error)
    for seed in range(5):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            shared = defense.shared_update(
                model, x, y, squared_error, torch.Generator().manual_seed(seed)
            )
        assert min(defense.last["losses"]) > defense.last["base_loss"]  # no candidate helps
        raw = all(torch.equal(shared[n], grads[n]) for n in grads)
        if fallback == "algorithm-1":  # exactly G0, counted, and said
            assert raw and defense.last["raw_gradient_shared"]
            assert any(issubclass(w.category, CensorFallbackWarning) for w in caught)
        else:  # never G0: the best orthogonal candidate (zero for the 1-element bias)
            assert not raw and not defense.last["raw_gradient_shared"]
            for n, g in grads.items():
                assert float((shared[n] * g).sum().abs()) <= 1e-5 * shared[n].norm() * g.norm()
            assert not shared["bias"].any() and shared["weight"].any()
    assert defense.stats["updates"] == 5 and defense.stats["fallbacks"] == 5
    assert defense.stats["raw_shared"] == (5 if fallback == "algorithm-1" else 0)


def test_the_old_fallback_names_are_refused_with_the_new_ones():
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match=r"'as-coded' was renamed; use 'algorithm-1'"):
        censor(fallback="as-coded")
    with pytest.raises(ConfigError, match=r"'best-candidate' was renamed; use 'never-raw'"):
        censor(fallback="best-candidate")
    with pytest.raises(ConfigError, match=r"'sometimes' is not one of algorithm-1, never-raw"):
        censor(fallback="sometimes")


@pytest.mark.parametrize("fallback", ["algorithm-1", "never-raw"])
def test_fl_training_records_each_rounds_fallback_and_raw_gradient_rates(fallback):
    from digits import fl_history

    defense = build_defense("censor", {"trials": 5, "fallback": fallback}, "t", update_lr=0.1)
    history = fl_history(defense, rounds=12)
    rounds = [h for h in history if h["round"] > 0]
    assert all(0 <= h["raw_gradient_rate"] <= h["fallback_rate"] <= 1 for h in rounds)
    # two clients a round: the rates are counts over 2, and add up to the run's counters
    assert sum(2 * h["fallback_rate"] for h in rounds) == defense.stats["fallbacks"]
    assert sum(2 * h["raw_gradient_rate"] for h in rounds) == defense.stats["raw_shared"]
    assert defense.stats["updates"] == 24 and defense.stats["fallbacks"] > 0
    if fallback == "algorithm-1":
        assert defense.stats["raw_shared"] == defense.stats["fallbacks"]
    else:
        assert defense.stats["raw_shared"] == 0
    assert "fallback_rate" not in history[0]  # round 0: no update yet


# Degenerate layers: no orthogonal direction of the gradient's norm exists.


class WithScalar(nn.Module):
    """A linear classifier times a learned scalar, plus a parameter the loss ignores (a zero
    gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 3)
        self.scale = nn.Parameter(torch.tensor([1.5]))
        self.unused = nn.Parameter(torch.ones(5))

    def forward(self, x):
        return self.fc(x.flatten(1)) * self.scale + 0.0 * self.unused.sum()


@pytest.mark.parametrize("subspace", ["batch", "per-sample"])
@pytest.mark.parametrize("evaluation", ["sequential", "batched"])
def test_a_one_element_and_a_zero_gradient_layer_give_a_finite_update(subspace, evaluation):
    model = WithScalar()
    x, y = torch.rand(3, 3, 2, 2), torch.tensor([0, 2, 1])
    grads = gradients_of(model, x, y, F.cross_entropy)
    assert grads["scale"].numel() == 1 and grads["scale"].abs() > 0
    assert not grads["unused"].any()
    defense = orthogonal(trials=6, subspace=subspace, evaluation=evaluation)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert all(torch.isfinite(t).all() for t in shared.values())  # the old code: NaN
    # R^1's complement of a non-zero gradient is {0}; a zero gradient's norm is 0
    assert torch.equal(shared["scale"], torch.zeros(1))
    assert torch.equal(shared["unused"], torch.zeros(5))
    if subspace == "per-sample":  # 3 samples' gradients span the 3 biases: nothing is left
        assert torch.equal(shared["fc.bias"], torch.zeros(3))
    for n in ("fc.weight",) if subspace == "per-sample" else ("fc.weight", "fc.bias"):
        assert abs(cos(shared[n], grads[n])) < 1e-5
        torch.testing.assert_close(shared[n].norm(), grads[n].norm(), rtol=1e-5, atol=0)
    assert defense.last["cosine"] is not None and abs(defense.last["cosine"]) < 1e-5


def test_orthogonal_direction_in_one_dimension_is_zero_and_never_nan():
    g, r = torch.tensor([0.3]), torch.tensor([-1.7])
    assert torch.equal(orthogonal_direction(g, r), torch.zeros(1))
    assert torch.equal(orthogonal_direction(torch.zeros(3), torch.ones(3)), torch.zeros(3))
    coded = orthogonal_direction(g, r, "as-coded")  # the code's formula shares ±g there
    assert torch.isfinite(coded).all() and coded.abs().item() == pytest.approx(0.3)


def test_a_non_finite_gradient_is_refused_and_gives_no_statistic():
    from gradinv.defenses import gradient_cosine

    model, x, y = case()
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="not finite"):
        censor(trials=2).shared_update(
            model, x, y, F.cross_entropy, torch.Generator().manual_seed(0)
        )
    nan = {"w": torch.tensor([1.0, float("nan")])}
    assert gradient_cosine(nan, {"w": torch.ones(2)}) is None
    assert gradient_cosine({"w": torch.zeros(2)}, {"w": torch.ones(2)}) is None


# One model mode for G0 and every loss (the threat model's model_mode at capture).


def batch_norm_case(seed):
    model = build_model(ModelSpec("convnet", 10, 3, 16, {"width": 4}), seed=0)
    g = torch.Generator().manual_seed(seed)
    return model, torch.rand(4, 3, 16, 16, generator=g), torch.tensor([1, 7, 3, 0])


def mode_gradient(model, x, y, train):
    copy_ = copy.deepcopy(model).train(train)
    return gradients_of(copy_, x, y, F.cross_entropy)


@pytest.mark.parametrize(
    ("mode", "train_model"), [("model", True), ("eval", True), ("model", False)]
)
def test_g0_and_every_loss_are_taken_in_one_mode_on_a_batch_norm_model(mode, train_model):
    scoring_train = train_model if mode == "model" else mode == "train"
    for seed in range(3):
        model, x, y = batch_norm_case(seed)
        model.train(train_model)
        expected_buffers = copy.deepcopy(model).train(scoring_train)
        gradients_of(expected_buffers, x, y, F.cross_entropy)  # G0's forward: the only update
        truth = mode_gradient(model, x, y, scoring_train)
        defense = orthogonal(trials=6, mode=mode)
        shared = defense.shared_update(
            model, x, y, F.cross_entropy, torch.Generator().manual_seed(seed)
        )
        assert model.training == train_model  # the mode is restored
        assert defense.last["mode"] == ("train" if scoring_train else "eval")
        for n, g in truth.items():  # orthogonal to the gradient of the mode that scores them
            assert abs(cos(shared[n], g)) < 1e-5, n
        expected = dict(expected_buffers.named_buffers())
        for n, b in model.named_buffers():  # scoring left the running statistics alone
            assert torch.equal(b, expected[n]), n
        # the recorded losses are the scoring mode's, at θ and at θ − η·G⋆
        scorer = copy.deepcopy(expected_buffers).train(scoring_train)
        params = {n: p.detach() for n, p in scorer.named_parameters()}
        with torch.no_grad():
            before = {n: b.clone() for n, b in model.named_buffers()}
            base = F.cross_entropy(functional_call(scorer, {**params, **before}, (x,)), y)
            moved = {n: p - 0.1 * shared[n] for n, p in params.items()}
            after = F.cross_entropy(functional_call(scorer, {**moved, **before}, (x,)), y)
        assert defense.last["base_loss"] == pytest.approx(float(base), rel=1e-5)
        assert min(defense.last["losses"]) == pytest.approx(float(after), rel=1e-5)


def test_batched_scoring_in_train_mode_matches_the_loop_and_keeps_the_statistics():
    model, x, y = batch_norm_case(0)
    model.train()
    runs = {}
    for evaluation in ("sequential", "batched"):
        m = copy.deepcopy(model)
        defense = orthogonal(trials=5, evaluation=evaluation)
        defense.shared_update(m, x, y, F.cross_entropy, torch.Generator().manual_seed(2))
        runs[evaluation] = (defense.last, dict(m.named_buffers()))
    (seq, seq_buffers), (bat, bat_buffers) = runs["sequential"], runs["batched"]
    assert seq["selected"] == bat["selected"]
    torch.testing.assert_close(
        torch.tensor(seq["losses"]), torch.tensor(bat["losses"]), rtol=1e-5, atol=1e-6
    )
    for n, b in seq_buffers.items():  # G0's forward alone moved them, in both
        torch.testing.assert_close(bat_buffers[n], b, rtol=0, atol=0)


# Eq. 11: orthogonal to every training instance's gradient.


@pytest.mark.parametrize("scope", ["layer-wise", "whole-model"])
def test_per_sample_subspace_is_orthogonal_to_each_sample_gradient(scope):
    model, x, y = batch_norm_case(0)
    model.eval()
    per_sample = per_sample_gradients(model, x, y, F.cross_entropy)
    grads = gradients_of(model, x, y, F.cross_entropy)
    defense = orthogonal(trials=4, subspace="per-sample", scope=scope)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    names = list(grads)
    if scope == "layer-wise":
        for n in names:
            if per_sample[n][0].numel() <= len(y) + 1:
                continue  # no room left: checked to be zero below
            for k in range(len(y)):
                assert abs(cos(shared[n], per_sample[n][k])) < 1e-5, (n, k)
            torch.testing.assert_close(shared[n].norm(), grads[n].norm(), rtol=1e-5, atol=0)
    else:
        whole = flat(shared, names)
        for k in range(len(y)):
            assert abs(cos(whole, flat({n: per_sample[n][k] for n in names}, names))) < 1e-5
    # the batch subspace (Algorithm 1) is orthogonal to the batch gradient only
    batch = orthogonal(trials=4, scope=scope).shared_update(
        model, x, y, F.cross_entropy, torch.Generator().manual_seed(0)
    )
    n = "classifier.weight" if "classifier.weight" in names else names[-2]
    worst = max(abs(cos(batch[n], per_sample[n][k])) for k in range(len(y)))
    assert worst > 1e-3


def test_per_sample_every_label_is_orthogonal_to_each_sample_under_each_label():
    model, x, y = batch_norm_case(1)
    model.eval()
    x, y = x[:2], y[:2]
    defense = orthogonal(trials=3, subspace="per-sample-every-label")
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    every = per_sample_gradients(
        model, x.repeat_interleave(10, 0), torch.arange(10).repeat(2), F.cross_entropy
    )
    big = [n for n in shared if shared[n].numel() > 21]
    assert big
    for n in big:
        for k in range(20):
            assert abs(cos(shared[n], every[n][k])) < 1e-5, (n, k)


def test_the_code_projection_takes_no_subspace():
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match="needs the exact projection"):
        censor(projection="as-coded", subspace="per-sample")


def test_selection_lr_overrides_the_update_lr():
    defense = build_defense("censor", {"trials": 2, "selection_lr": 1e-4}, "t", update_lr=None)
    share(defense)  # runs with η = 1e-4 and no FL learning rate
    with pytest.raises(ValueError, match="selection_lr"):
        share(build_defense("censor", {"trials": 2}, "t", update_lr=None))


# source: public (Section V-E, Fig. 10): directions from gradients of public images of one class.

POOL_CLASS = 3


def public_pool_of(n=4, seed=10):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 16, 16, generator=g), torch.full((n,), POOL_CLASS)


def public_censor(pool=None, **settings):
    pool = public_pool_of() if pool is None else pool
    settings = {
        "source": "public",
        "public_class": POOL_CLASS,
        "public_images": 4,
        "fallback": "never-raw",  # the candidates' own properties
        **settings,
    }
    return build_defense("censor", settings, where="test", update_lr=0.1, public=pool)


def flat(d, names):
    return torch.cat([d[n].reshape(-1) for n in names])


def test_public_source_is_orthogonal_norm_matched_and_built_from_the_drawn_image():
    pool = public_pool_of()
    defense = public_censor(pool, trials=5)
    shared, original, model, *_ = share(defense)
    for name, g in original.items():
        assert abs(cos(shared[name], g)) < 1e-5, name
        torch.testing.assert_close(shared[name].norm(), g.norm(), rtol=1e-5, atol=1e-12)
    k = defense.last["public_image"]  # the pool image behind the shared direction
    r = gradients_of(model, pool[0][k : k + 1], pool[1][k : k + 1], F.cross_entropy)
    for name, g in original.items():
        expected = orthogonal_direction(g, r[name])
        torch.testing.assert_close(shared[name], expected, rtol=1e-4, atol=1e-7)


def test_public_source_whole_model_is_orthogonal_and_norm_matched_as_a_whole():
    shared, original, *_ = share(public_censor(trials=5, scope="whole-model"))
    names = list(original)
    assert abs(cos(flat(shared, names), flat(original, names))) < 1e-5
    torch.testing.assert_close(
        flat(shared, names).norm(), flat(original, names).norm(), rtol=1e-5, atol=0
    )


def test_public_source_points_the_update_along_a_public_image_gradient():
    # What misleads the attack toward the public class (Fig. 10): the shared update is close in
    # direction to the gradient of a public image; a Gaussian direction is not.
    cosines = {"public": [], "gaussian": []}
    for seed in range(3):
        pool = public_pool_of(seed=100 + seed)
        model, x, y = case(seed)
        names = [n for n, _ in model.named_parameters()]
        public_grads = [
            flat(
                gradients_of(model, pool[0][i : i + 1], pool[1][i : i + 1], F.cross_entropy), names
            )
            for i in range(len(pool[1]))
        ]
        for source in cosines:
            defense = public_censor(pool, trials=5, source=source)
            gen = torch.Generator().manual_seed(seed)
            s = flat(defense.shared_update(model, x, y, F.cross_entropy, gen), names)
            cosines[source].append(max(cos(s, p) for p in public_grads))
    public, gaussian = (sum(v) / len(v) for v in cosines.values())
    assert public > gaussian + 0.5, cosines


def test_public_source_the_same_seed_gives_the_same_update_and_another_seed_another():
    # Few trials from a larger pool: with T >= N every seed tends to draw the best image.
    pool = public_pool_of(8)
    a, *_ = share(public_censor(pool, trials=2, public_images=8), seed=3)
    b, *_ = share(public_censor(pool, trials=2, public_images=8), seed=3)
    c, *_ = share(public_censor(pool, trials=2, public_images=8), seed=5)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


def test_per_sample_gradients_match_one_image_at_a_time_and_keep_batch_norm_buffers():
    model = build_model(ModelSpec("convnet", 10, 3, 16, {"width": 2}), seed=0).train()
    x, y = public_pool_of(3)
    before = {n: b.clone() for n, b in model.named_buffers()}
    per_image = per_sample_gradients(model, x, y, F.cross_entropy)
    assert all(torch.equal(before[n], b) for n, b in model.named_buffers())
    for i in range(3):
        alone = gradients_of(copy.deepcopy(model), x[i : i + 1], y[i : i + 1], F.cross_entropy)
        for n, g in alone.items():
            if ".weight" in n:  # a bias before batch norm has a zero gradient: noise vs noise
                assert (per_image[n][i] - g).norm() <= 1e-4 * g.norm(), n


def test_public_source_without_a_pool_or_with_the_wrong_pool_is_a_clear_error():
    settings = {"source": "public", "public_class": POOL_CLASS, "public_images": 4}
    no_pool = build_defense("censor", settings, where="test", update_lr=0.1)
    with pytest.raises(ValueError, match=r"needs its public pool.*public="):
        share(no_pool)
    images, labels = public_pool_of()
    with pytest.raises(ValueError, match="public_class=3"):
        share(public_censor((images, labels.clone().fill_(5))))
    with pytest.raises(ValueError, match="public_images=4"):
        share(public_censor((images[:3], labels[:3])))
    from gradinv.settings import ConfigError

    with pytest.raises(ConfigError, match="public_class"):
        build_defense("censor", {"public_class": -1}, where="test")
    with pytest.raises(ConfigError, match="public_images"):
        build_defense("censor", {"public_images": 0}, where="test")


def prepared(val_labels, train_labels=(0, 1, 2)):
    """A tiny prepared dataset whose image values tell the split (train 200+) and the index."""
    val = torch.tensor(val_labels)
    train = torch.tensor(train_labels)
    return PreparedDataset(
        name="toy",
        paper_name="Toy",
        train_images=(200 + torch.arange(len(train))).view(-1, 1, 1, 1).expand(-1, 1, 2, 2),
        train_labels=train,
        val_images=torch.arange(len(val)).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).to(torch.uint8),
        val_labels=val,
        classes=("a", "b", "c"),
        mean=(0.5,),
        std=(0.25,),
        sha256="0" * 64,
    )


def test_public_pool_is_the_last_validation_images_of_the_class():
    ds = prepared([0, 1, 2, 1, 0, 1, 2, 1, 0, 2])  # classes interleaved, as in most sources
    images, labels = public_pool(ds, 1, 3)
    assert labels.tolist() == [1, 1, 1]
    index = (images[:, 0, 0, 0] * 255).round().long().tolist()
    assert index == [3, 5, 7]  # validation indices, not train ones (those would be 200+)
    assert public_pool_indices(ds, 1, 3) == [3, 5, 7]
    assert public_pool_indices(ds, 2, 1) == [9]


def test_public_pool_refuses_a_missing_class_and_a_short_class():
    ds = prepared([0, 1, 2, 1, 0, 1, 2, 1, 0, 2])
    with pytest.raises(ValueError, match=r"no class 3: its classes are 0\.\.2"):
        public_pool(ds, 3, 1)
    with pytest.raises(ValueError, match=r"class 2 \(c\) of toy has 3 validation.*asks for 4"):
        public_pool(ds, 2, 4)
    with pytest.raises(ValueError, match=r"has 2 validation image\(s\) outside the attacked batch"):
        public_pool(ds, 2, 3, exclude=[6])


def test_public_pool_reaches_past_the_attacked_batch_and_leaves_other_pools_alone():
    """A victim's own images never enter the pool its defense draws from (the measured run of
    issue 30 met this: victim 1, validation image 93, in patches class 0's last 16, 84..99)."""
    ds = prepared([1, 0, 2, 1, 0, 1, 2, 1, 0, 2, 1])
    assert public_pool_indices(ds, 1, 3) == [5, 7, 10]
    assert public_pool_indices(ds, 1, 3, exclude=[7, 8]) == [3, 5, 10]
    images, labels = public_pool(ds, 1, 3, exclude=[7, 8])
    assert (images[:, 0, 0, 0] * 255).round().long().tolist() == [3, 5, 10]
    assert labels.tolist() == [1, 1, 1]
    assert public_pool_indices(ds, 1, 3, exclude=[0, 1, 2]) == [5, 7, 10]  # a batch elsewhere


def test_the_public_figure_measures_the_pull_toward_the_public_class(tmp_path, monkeypatch):
    """CENSOR's Fig. 10 stage: each reconstruction's MSE to its original and to the nearest
    public image, and a grid whose caption names the scale (and no overlapping text)."""
    import pandas as pd
    from PIL import Image

    monkeypatch.setenv("GRADINV_FIGURE_CHECK", "strict")

    from gradinv.io import save_tensors, write_json
    from gradinv.stages import public

    g = torch.Generator().manual_seed(0)
    val = (torch.rand(6, 3, 8, 8, generator=g) * 255).to(torch.uint8)
    labels = torch.tensor([0, 1, 0, POOL_CLASS, POOL_CLASS, POOL_CLASS])
    prepared = PreparedDataset(
        "patches", "Patches", val, labels, val, labels, tuple("abcd"), (0.5,) * 3, (0.5,) * 3, ""
    )
    monkeypatch.setattr(public, "load_prepared", lambda name, _dir: prepared)
    pool = prepared.val_batch([3, 4, 5])[0]
    original = prepared.val_batch([0])[0]
    metrics = []
    # the public defense's reconstruction is a public image; no defense's is the original
    for defense, image in (("none", original[0]), ("censor_public", pool[1])):
        run = tmp_path / defense
        attack = {"victims": [0], "runs": [{"status": "ok", "images": image[None]}]}
        save_tensors(run / "attack.pt", attack)  # an attack job's file, one victim
        save_tensors(run / "victim.pt", {"images": original, "indices": torch.tensor([0])})
        row = {
            "dataset": "patches",
            "dataset_label": "Patches",
            "defense": defense,
            "defense_label": defense,
            "attack": "ig",
            "attack_label": "IG",
            "victim": 0,
            "status": "ok",
            "reconstruction": str(run / "attack.pt"),  # the files the record scored
            "reconstruction_index": 0,
            "victim_file": str(run / "victim.pt"),
        }
        write_json(run / "v1.json", {"runs": [row]})  # a cell's score file
        metrics.append(run / "v1.json")
    settings = {
        "title": "CENSOR Fig. 10",
        "scale": "embedded",
        "public_defense": "censor_public",
        "defenses": {
            "censor_public": {
                "kind": "censor",
                "source": "public",
                "public_class": POOL_CLASS,
                "public_images": 3,
            }
        },
    }
    public.run(settings, metrics, tmp_path / "prepared", tmp_path / "out")
    drift = pd.read_csv(tmp_path / "out" / "fig10_public_drift.csv").set_index("defense")
    assert not drift.loc["none", "closer_to_public"] and drift.loc["none", "mse_to_original"] == 0
    assert drift.loc["censor_public", "closer_to_public"]
    assert drift.loc["censor_public", "mse_to_public"] == 0
    with Image.open(tmp_path / "out" / "fig10_public.png") as img:
        assert img.text["Title"].startswith("CENSOR Fig. 10: nearest public image. SCALED-DOWN")
