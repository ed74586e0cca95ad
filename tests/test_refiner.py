"""Refiner (defenses/refiner.py): the epsilon projection, the search, the warm start, and FL
training that still learns under it."""

import pytest
import torch
import torch.nn.functional as F

from digits import MEAN, SPEC, STD, digits, fl_accuracy
from gradinv.defenses import build_defense, gradients_of
from gradinv.metrics.evaluation_network import EvaluationNetwork
from gradinv.models import build_model
from gradinv.protocol import normalize


def network(seed: int = 0) -> EvaluationNetwork:
    """A small evaluation network (random weights: these tests check the defense's mechanics,
    which hold for any differentiable D; tests/test_evalnet.py checks a trained one)."""
    torch.manual_seed(seed)
    return EvaluationNetwork(1, 16, width=8).eval().requires_grad_(False)


def refiner(**settings):
    return build_defense(
        "refiner",
        settings,
        where="defenses.refiner",
        normalization=(MEAN, STD),
        evaluation_network=network(),
    )


def case(n: int = 5):
    images, labels = digits()
    model = build_model(SPEC, seed=0).eval()
    return model, normalize(images[:n], MEAN, STD), labels[:n]


def distance(a, b) -> float:
    return float(torch.sqrt(sum((a[n] - b[n]).pow(2).sum() for n in b)))


@pytest.mark.parametrize("scale", ["absolute", "relative"])
@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 5.0])
def test_the_shared_gradient_stays_within_epsilon_of_the_true_one(epsilon, scale):
    """Appendix J: ||g_upload - g|| <= epsilon (times ||g|| when relative)."""
    model, x, y = case()
    true = gradients_of(model, x, y, F.cross_entropy)
    defense = refiner(epsilon=epsilon, epsilon_scale=scale)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    norm = distance(true, {n: torch.zeros_like(g) for n, g in true.items()})
    bound = epsilon * (norm if scale == "relative" else 1.0)
    assert distance(shared, true) <= bound * (1 + 1e-5)
    last = defense.last
    assert last["epsilon"] == pytest.approx(bound)
    if last["projected"]:  # on the sphere, toward the robust data's gradient
        assert distance(shared, true) == pytest.approx(bound, rel=1e-4)
    else:
        assert last["gradient_distance"] <= bound


def test_within_epsilon_the_robust_datas_own_gradient_is_shared():
    model, x, y = case()
    defense = refiner(epsilon=1e6)
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    true = gradients_of(model, x, y, F.cross_entropy)
    assert not defense.last["projected"]
    assert distance(shared, true) == pytest.approx(defense.last["gradient_distance"], rel=1e-4)
    assert distance(shared, true) > 0  # the shared update is not the plain gradient


def test_the_search_raises_the_noise_ratio_of_the_robust_data():
    """With beta > 0 the privacy term pushes x* toward what D calls noise; with beta = 0 and no
    steps, x* is the noise-blended start."""
    model, x, y = case()
    pushed = refiner(epsilon=1e6, beta=1.0, iterations=10, lr=1.0)
    pushed.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert pushed.last["noise_ratio"] > pushed.last["noise_ratio_start"]
    still = refiner(epsilon=1e6, iterations=0)
    still.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert still.last["noise_ratio"] == pytest.approx(still.last["noise_ratio_start"])
    # alpha 0.5: half noise, so the start is far from the images but not unrelated to them
    assert 0.01 < still.last["image_mse"] < 0.25


def test_the_utility_term_pulls_the_robust_datas_gradient_toward_the_true_one():
    """UM alone (beta 0), on the paper's LeNet where it is not negligible: the search lowers the
    weighted gradient gap of the noise-blended start, and with it ||g* - g||."""
    spec = SPEC.__class__("lenet", 10, 1, 16, {})
    model = build_model(spec, seed=0).eval()
    _, x, y = case()
    settings = {"epsilon": 1e6, "beta": 0.0}  # lr 1, the default
    searched = refiner(iterations=20, **settings)
    searched.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    start = refiner(iterations=0, **settings)
    start.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    last = searched.last
    assert last["utility_gap"] < 0.95 * last["utility_gap_start"]  # measured: 4.7e-4 -> 4.2e-4
    assert last["gradient_distance"] < start.last["gradient_distance"]


def test_the_layer_weights_decay_with_depth():
    model, x, y = case()
    defense = refiner()
    true = gradients_of(model, x, y, F.cross_entropy)
    weights = defense._weights(model, true)
    assert set(weights) == set(true)
    params = dict(model.named_parameters())
    first, last = "0.weight", "7.weight"  # cnn3: layer 1 and layer 4
    assert torch.allclose(weights[first], (true[first] * params[first]).abs() * 0.95)
    assert torch.allclose(weights[last], (true[last] * params[last]).abs() * 0.95**4)


def test_the_warm_start_reuses_robust_data_and_survives_a_state_round_trip():
    model, five, y = case()
    x, y = five[:4], y[:4]
    defense = refiner(warm_start=True, iterations=4, warm_iterations=2)
    gen = torch.Generator().manual_seed(0)
    defense.shared_update(model, x, y, F.cross_entropy, gen)
    assert not defense.last["warm_start"] and defense.last["iterations"] == 4
    state = defense.state_dict()
    again = refiner(warm_start=True, iterations=4, warm_iterations=2)
    again.load_state_dict(state)
    a = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(1))
    b = again.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(1))
    assert defense.last["warm_start"] and defense.last["iterations"] == 2
    assert all(torch.equal(a[n], b[n]) for n in a)
    # one image the client has no robust data for: the whole batch starts afresh
    changed = torch.cat([x[:3], five[4:5]])
    defense.shared_update(model, changed, y, F.cross_entropy, gen)
    assert not defense.last["warm_start"] and defense.last["iterations"] == 4


def test_a_missing_evaluation_network_is_a_clear_error():
    model, x, y = case()
    defense = build_defense("refiner", {}, "d", normalization=(MEAN, STD))
    with pytest.raises(ValueError, match=r"evaluation network.*snakemake data/evalnet"):
        defense.shared_update(model, x, y, F.cross_entropy, torch.Generator())


def test_batch_norm_statistics_move_once_as_for_an_undefended_client():
    spec = SPEC.__class__("resnet18", 10, 1, 16, {"width": 8, "small_image_stem": True})
    model = build_model(spec, seed=0).train()
    _, x, y = case()
    plain = build_model(spec, seed=0).train()
    build_defense("none", {}, "d").shared_update(plain, x, y, F.cross_entropy, torch.Generator())
    defense = refiner(iterations=3)
    defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    moved = dict(model.named_buffers())
    once = dict(plain.named_buffers())
    # the search does not move them; only the final pass (on x*, not x) does, by one step
    assert moved["bn1.num_batches_tracked"] == once["bn1.num_batches_tracked"] == 1


def test_fl_training_still_learns_under_refiner():
    defense = build_defense(
        "refiner",
        {"epsilon": 0.5, "iterations": 3},
        "d",
        normalization=(MEAN, STD),
        evaluation_network=network(),
    )
    accuracy = fl_accuracy(defense, rounds=60, lr=0.3)
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy  # no defense: 0.10 -> 0.88 (seed 0)
