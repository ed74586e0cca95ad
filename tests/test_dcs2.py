"""DCS² (defenses/dcs2.py): the sensitive samples, the concealed samples, the projection of
DCS²+, and FL training that still learns under it."""

import pytest
import torch
import torch.nn.functional as F

from digits import MEAN, SPEC, STD, digits, fl_accuracy
from gradinv.defenses import build_defense, gradients_of
from gradinv.defenses.dcs2 import DCS2, _dot
from gradinv.metrics import MetricSettings, score
from gradinv.models import build_model
from gradinv.protocol import denormalize, normalize


def dcs2(**settings):
    return build_defense(
        "dcs2", {"iterations": 5, **settings}, where="defenses.dcs2", normalization=(MEAN, STD)
    )


def case(n: int = 4):
    images, labels = digits()
    picks = [0, 1, 2, 10][:n]  # digits 0, 1, 2, 0: two share a label
    model = build_model(SPEC, seed=0).eval()
    return model, normalize(images[picks], MEAN, STD), labels[picks]


def random_grads(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(5, 3, generator=gen), "b": torch.randn(7, generator=gen)}


@pytest.mark.parametrize("margin", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(6))
def test_the_projection_restores_a_descent_direction(seed, margin):
    """Eq. 8-9: <g, g^_c> >= 0 and g^_c = g_c + v g with v >= margin (the code's GEM margin
    bounds v); with margin 0, the closest such gradient to g_c."""
    g = random_grads(seed)
    g_c = {n: -v + 0.3 * random_grads(seed + 100)[n] for n, v in g.items()}  # opposed to g
    assert _dot(g, g_c) < 0
    projected = dcs2(margin=margin)._project(g, g_c)
    assert _dot(g, projected) >= -1e-6
    v = (projected["a"] - g_c["a"]) / g["a"]
    assert torch.allclose(v, v.flatten()[0].expand_as(v), atol=1e-5)
    assert v.flatten()[0] >= margin - 1e-6
    if margin == 0.0:  # the closed form of the one-constraint QP: remove the opposing part
        closest = {n: g_c[n] - _dot(g, g_c) / _dot(g, g) * g[n] for n in g}
        assert all(torch.allclose(projected[n], closest[n], atol=1e-5) for n in g)
        assert abs(_dot(g, projected)) < 1e-5


def test_dcs2_plus_shares_a_gradient_with_a_nonnegative_inner_product(monkeypatch):
    """Through shared_update: when the concealed mixture opposes the batch's gradient, DCS²+
    projects it; DCS² alone shares it as it is."""
    model, x, y = case()
    true = gradients_of(model, x, y, F.cross_entropy)
    opposed = {n: -3.0 * v for n, v in true.items()}
    monkeypatch.setattr(DCS2, "_mix", lambda self, *a, **k: dict(opposed))
    plus = dcs2(projection=True)
    shared = plus.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert plus.last["projected"] and plus.last["cosine_before_projection"] < 0
    assert _dot(true, shared) >= -1e-6
    plain = dcs2(projection=False)
    shared = plain.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert not plain.last["projected"] and _dot(true, shared) < 0


def test_the_sensitive_samples_and_the_shared_batch_size():
    _, _, y = case()  # labels 0, 1, 2, 0
    half = dcs2(fraction=0.5)
    assert half.sensitive_indices(y) == [0, 1] and half.shared_batch_size(y) == 6
    assert dcs2(fraction=0.5).sensitive_indices(y[:1]) == [0]  # a lone image is sensitive
    by_label = dcs2(sensitive="labels", labels=[0], concealed=2)
    assert by_label.sensitive_indices(y) == [0, 3] and by_label.shared_batch_size(y) == 8
    assert dcs2(sensitive="labels", labels=[7]).sensitive_indices(y) == []


def test_nothing_sensitive_shares_the_plain_gradient():
    model, x, y = case()
    defense = dcs2(sensitive="labels", labels=[7])
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator())
    true = gradients_of(model, x, y, F.cross_entropy)
    assert all(torch.equal(shared[n], true[n]) for n in true)
    assert defense.last["sensitive"] == [] and defense.last["concealed"] == 0


@pytest.mark.parametrize("start", ["batch", "noise", "public"])
def test_concealed_samples_conceal_their_sensitive_sample(start):
    """The shared update differs from the plain gradient; each concealed sample is a valid image
    unlike its sensitive sample, its search lowered its objective, and it starts where told."""
    model, x, y = case()
    images, labels = digits()
    defense = dcs2(start=start, iterations=15)
    defense.public = (normalize(images[100:116], MEAN, STD), labels[100:116])
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    true = gradients_of(model, x, y, F.cross_entropy)
    assert max((shared[n] - true[n]).abs().max() for n in true) > 1e-4
    last = defense.last
    assert last["start"] == start and last["concealed"] == 2
    assert last["objective"] < last["objective_start"]
    assert last["input_distance"] > 1.0


def test_a_batch_start_prefers_another_label_and_a_lone_image_starts_from_noise():
    _, _, y = case()  # labels 0, 1, 2, 0
    assert DCS2._other(y, 0, 0) == 1  # not sample 3, which shares sample 0's label
    assert DCS2._other(y, 0, 2) == 3  # the third concealed sample: the same label, last
    model, x, y = case(1)
    auto = dcs2(start="auto")
    auto.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert auto.last["start"] == "noise"
    with pytest.raises(ValueError, match="start: batch needs another sample"):
        dcs2(start="batch").shared_update(model, x, y, F.cross_entropy, torch.Generator())


def concealed_samples(monkeypatch, defense, model, x, y):
    """The concealed samples a shared update made (caught on their way to Eq. 7)."""
    caught = {}
    original = DCS2._mix

    def catch(self, model, inputs, labels, g, concealed, *rest):
        caught["x"] = concealed
        return original(self, model, inputs, labels, g, concealed, *rest)

    monkeypatch.setattr(DCS2, "_mix", catch)
    defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    return caught["x"]


def test_the_box_keeps_concealed_samples_valid_images(monkeypatch):
    model, x, y = case()
    concealed = concealed_samples(monkeypatch, dcs2(iterations=30, lr=1.0), model, x, y)
    pixels = denormalize(concealed, MEAN, STD)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5


def test_a_sample_stopped_early_stays_where_it_stopped(monkeypatch):
    """The code's early stop: a concealed sample that moved farther than stop_distance from its
    sensitive sample leaves the search where it is (Adam's momentum must not carry it on)."""
    model, x, y = case()
    one_step = concealed_samples(monkeypatch, dcs2(iterations=1), model, x, y)
    assert (one_step - x[:2]).flatten(1).norm(dim=1).min() > 1e-3
    stopped = concealed_samples(monkeypatch, dcs2(iterations=40, stop_distance=1e-3), model, x, y)
    assert torch.equal(stopped, one_step)  # every sample is beyond 1e-3 after its first step


def test_the_search_leaves_no_gradient_on_the_model(monkeypatch):
    model, x, y = case()
    concealed_samples(monkeypatch, dcs2(iterations=3), model, x, y)
    assert all(p.grad is None for p in model.parameters())


def test_the_augmented_batch_is_one_pass_also_with_batch_norm(monkeypatch):
    """Eq. 7 with lam = 1 is the gradient of the batch augmented by the concealed samples (the
    paper's words): one pass over [concealed; batch], train-mode batch norm included, and the
    running statistics move once, with that pass."""
    spec = SPEC.__class__("resnet18", 10, 1, 16, {"width": 8, "small_image_stem": True})
    model = build_model(spec, seed=0).train()
    _, x, y = case()
    defense = dcs2(lam=1.0, iterations=2)
    concealed = concealed_samples(monkeypatch, defense, model, x, y)
    monkeypatch.undo()
    starts = torch.stack([y[1], y[2]])  # the batch start: the first other label (case's labels)
    reference = build_model(spec, seed=0).train()
    augmented = gradients_of(
        reference, torch.cat([concealed, x]), torch.cat([starts, y]), F.cross_entropy
    )
    model = build_model(spec, seed=0).train()
    shared = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(0))
    assert all(torch.allclose(shared[n], augmented[n], atol=1e-5) for n in augmented)
    moved, once = dict(model.named_buffers()), dict(reference.named_buffers())
    assert all(torch.allclose(moved[n].float(), once[n].float()) for n in once)


def test_only_the_sensitive_samples_are_scored():
    """The score stage passes the sensitive originals only; each is matched to its own best
    reconstruction among the shared batch's (concealed samples included)."""
    images, _ = digits()
    sensitive = images[:1]
    recon = torch.stack([images[5], images[0] * 0.9, images[7]])  # the second recovers it
    result = score(recon, sensitive, metrics=["mse", "psnr"], settings=MetricSettings())
    assert result["matching"] == [1] and result["psnr"] > 20
    with pytest.raises(ValueError, match="must be matched"):
        score(recon, sensitive, metrics=["mse"], settings=MetricSettings(match=False))


def test_fl_training_still_learns_under_dcs2_plus():
    defense = dcs2(projection=True, sensitive="labels", labels=[0], iterations=3)
    accuracy = fl_accuracy(defense, rounds=60, lr=0.3)
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy  # no defense: 0.10 -> 0.88 (seed 0)


def test_eq7_as_printed_outweighs_the_batch_and_stalls_training():
    """``mixing: literal`` adds a concealed sample's whole gradient to the batch's mean: at
    batch 16 it weighs as much as the 16 images together (measured: 0.10 -> 0.09 in 60 rounds,
    against 0.85 for the augmented-batch mean)."""
    model, x, y = case()
    literal = dcs2(mixing="literal", iterations=0)
    augmented = dcs2(mixing="augmented", iterations=0)
    gen = torch.Generator
    a = literal.shared_update(model, x, y, F.cross_entropy, gen().manual_seed(0))
    b = augmented.shared_update(model, x, y, F.cross_entropy, gen().manual_seed(0))
    g = gradients_of(model, x, y, F.cross_entropy)
    # B = 4, two concealed: literal = g + c, augmented = (4 g + c) / 6
    assert all(torch.allclose(6 * b[n] - 4 * g[n], a[n] - g[n], atol=1e-5) for n in g)


def test_known_labels_cannot_describe_a_batch_with_concealed_samples(tmp_path, capsys):
    """The capture refuses DCS² under threat_model.labels: known, before any search: the
    shared batch holds samples the client made, whose labels are no data's."""
    from stages import Stages

    s = Stages(tmp_path, defense="dcs2", threat_model__labels="known")
    for step in (s.prepare, s.partition_data, s.select_victim):
        assert step() == 0
    s.captured_checkpoint.parent.mkdir(parents=True, exist_ok=True)
    spec = SPEC.__class__("cnn3", 15, 3, 32, {"channels": [16, 32, 64], "kernel_size": 5})
    from gradinv.io import save_tensors
    from gradinv.protocol import ServerMessage

    save_tensors(
        s.captured_checkpoint, ServerMessage(spec, build_model(spec).state_dict(), 0).to_dict()
    )
    assert s.capture_update() == 2
    assert "threat_model.labels: known" in capsys.readouterr().err
    assert not s.capture.exists()
