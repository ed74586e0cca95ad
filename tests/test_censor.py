"""CENSOR's properties: orthogonal, norm-matched candidates; argmin selection; seeded; and the
official code's deviations reproduced when asked for."""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from gradinv.defenses import build_defense, gradients_of
from gradinv.defenses.censor import CensorFallbackWarning
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
