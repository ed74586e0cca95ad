"""CENSOR's properties: orthogonal, norm-matched candidates; argmin selection; seeded; and the
official code's deviations reproduced when asked for."""

import copy

import pytest
import torch
import torch.nn.functional as F
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


def share(defense, seed=0, data_seed=0):
    model, x, y = case(data_seed)
    out = defense.shared_update(model, x, y, F.cross_entropy, torch.Generator().manual_seed(seed))
    return out, gradients_of(model, x, y, F.cross_entropy), model, x, y


def cos(a, b):
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_exact_projection_is_orthogonal_and_norm_matched_per_layer():
    shared, original, *_ = share(censor(trials=5))
    assert shared.keys() == original.keys()
    for name, g in original.items():
        assert abs(cos(shared[name], g)) < 1e-5, name
        torch.testing.assert_close(shared[name].norm(), g.norm(), rtol=1e-5, atol=1e-12)


def test_whole_model_scope_is_orthogonal_and_norm_matched_as_a_whole():
    shared, original, *_ = share(censor(trials=5, scope="whole-model"))
    flat = lambda d: torch.cat([d[n].reshape(-1) for n in original])  # noqa: E731
    assert abs(cos(flat(shared), flat(original))) < 1e-5
    torch.testing.assert_close(flat(shared).norm(), flat(original).norm(), rtol=1e-5, atol=0)
    per_layer = [abs(cos(shared[n], original[n])) for n in original]
    assert max(per_layer) > 1e-3  # each layer alone is not constrained


def test_the_selected_candidate_has_the_lowest_evaluated_loss():
    defense = censor(trials=8)
    shared, _, model, x, y = share(defense)
    losses = defense.last["losses"]
    assert defense.last["selected"] == min(range(len(losses)), key=losses.__getitem__)
    model.eval()
    moved = {n: p.detach() - 0.1 * shared[n] for n, p in model.named_parameters()}
    with torch.no_grad():
        loss = F.cross_entropy(functional_call(model, moved, (x,)), y)
    assert float(loss) == pytest.approx(min(losses), rel=1e-6)


def test_the_same_seed_gives_the_same_update_and_another_seed_another():
    a, *_ = share(censor(trials=4), seed=3)
    b, *_ = share(censor(trials=4), seed=3)
    c, *_ = share(censor(trials=4), seed=4)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)


def test_device_draws_change_nothing_on_the_cpu():
    a, *_ = share(censor(trials=4), seed=3)
    b, *_ = share(censor(trials=4, draws="device"), seed=3)
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_draws_on_a_gpu_are_seeded_and_orthogonal():
    from gradinv.defenses.censor import _draw_generator

    gpu = torch.device("cuda")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    d1, d2 = _draw_generator(g1, gpu, "device"), _draw_generator(g2, gpu, "device")
    assert d1.device.type == "cuda" and d1.initial_seed() == d2.initial_seed()
    grads = {"w": torch.randn(300, 40, device=gpu)}
    out = censor(trials=3, draws="device")._candidate(grads, d1)["w"]
    assert out.device.type == "cuda" and abs(cos(out, grads["w"])) < 1e-5


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


def test_batched_and_sequential_evaluation_select_the_same_candidate():
    seq, bat = censor(trials=6, evaluation="sequential"), censor(trials=6, evaluation="batched")
    a, *_ = share(seq)
    b, *_ = share(bat)
    assert seq.last["selected"] == bat.last["selected"]
    torch.testing.assert_close(torch.tensor(seq.last["losses"]), torch.tensor(bat.last["losses"]))
    assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("fallback", ["best-candidate", "as-coded"])
def test_the_fallback_when_no_candidate_lowers_the_loss(monkeypatch, fallback):
    defense = censor(trials=3, fallback=fallback)
    real = defense._losses

    def worse(*args):  # every candidate raises the loss
        _, losses = real(*args)
        return losses.min() - 1.0, losses

    monkeypatch.setattr(defense, "_losses", worse)
    if fallback == "as-coded":
        with pytest.warns(CensorFallbackWarning, match="unprotected"):
            shared, original, *_ = share(defense)
        assert all(torch.equal(shared[n], original[n]) for n in original)  # the leak, as coded
        assert defense.last["cosine"] == pytest.approx(1.0)
    else:
        shared, original, *_ = share(defense)
        assert abs(defense.last["cosine"]) < 1e-4
    assert defense.last["fallback_fired"] and defense.stats["fallbacks"] == 1


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
    settings = {"source": "public", "public_class": POOL_CLASS, "public_images": 4, **settings}
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


def test_public_pool_refuses_a_missing_class_a_short_class_and_the_victims_images():
    ds = prepared([0, 1, 2, 1, 0, 1, 2, 1, 0, 2])
    with pytest.raises(ValueError, match=r"no class 3: its classes are 0\.\.2"):
        public_pool(ds, 3, 1)
    with pytest.raises(ValueError, match=r"class 2 \(c\) of toy has 3 validation.*asks for 4"):
        public_pool(ds, 2, 4)
    with pytest.raises(ValueError, match=r"\[5\] of the attacked batch"):
        public_pool(ds, 1, 3, exclude=[4, 5])
    public_pool(ds, 1, 3, exclude=[0, 1, 2])  # victims outside the pool are fine


def test_the_public_figure_measures_the_pull_toward_the_public_class(tmp_path, monkeypatch):
    """CENSOR's Fig. 10 stage: each reconstruction's MSE to its original and to the nearest
    public image, and a grid whose caption names the scale."""
    import pandas as pd
    from PIL import Image

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
    files = {"metrics": [], "reconstructions": [], "victims": []}
    # the public defense's reconstruction is a public image; no defense's is the original
    for defense, image in (("none", original[0]), ("censor_public", pool[1])):
        run = tmp_path / defense
        row = {
            "dataset": "patches",
            "dataset_label": "Patches",
            "defense": defense,
            "defense_label": defense,
            "attack": "ig",
            "attack_label": "IG",
            "victim": 0,
            "status": "ok",
        }
        write_json(run / "metrics.json", row)
        save_tensors(run / "attack.pt", {"status": "ok", "images": image[None]})
        save_tensors(run / "victim.pt", {"images": original})
        for key, name in zip(files, ("metrics.json", "attack.pt", "victim.pt"), strict=True):
            files[key].append(run / name)
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
    public.run(settings, *files.values(), tmp_path / "prepared", tmp_path / "out")
    drift = pd.read_csv(tmp_path / "out" / "fig10_public_drift.csv").set_index("defense")
    assert not drift.loc["none", "closer_to_public"] and drift.loc["none", "mse_to_original"] == 0
    assert drift.loc["censor_public", "closer_to_public"]
    assert drift.loc["censor_public", "mse_to_public"] == 0
    with Image.open(tmp_path / "out" / "fig10_public.png") as img:
        assert img.text["Title"].startswith("CENSOR Fig. 10: nearest public image. SCALED-DOWN")
