"""The EOT adaptive attack (CENSOR's Table III), a setting of every attack: off by default and
then unchanged; its samples are the capture's defense as configured (CENSOR: orthogonal,
norm-matched, differentiable; noise: g + std·N); each combine mode means what it says and runs
against a CENSOR update; a deterministic defense leaves nothing to sample; seeded and resumable."""

import pytest
import torch
import torch.nn.functional as F

from generative import few, ready
from gradinv.attacks import ATTACKS, ThreatModel, build_attack
from gradinv.attacks.eot import eot_distance
from gradinv.attacks.matching import cosine_distance, cosine_distances, total_variation
from gradinv.defenses import build_defense
from gradinv.models import build_model
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec, PublicMeta, SharedUpdate, denormalize, normalize
from interrupt import Interrupted, StopAfter
from test_attacks import MEAN, STD, capture, photo_patch

COMBINES = ["average-gradient", "average-loss", "best-sample"]


def censored_case(**censor):
    """A CENSOR-defended gradient of one 16x16 photograph on the tiny CNN (label 2, known)."""
    x, y = photo_patch(16)[None], torch.tensor([2])
    server, update = capture("cnn3", x, y, known=True)
    model = build_model(server.model)
    model.load_state_dict(server.state)
    model.eval()
    settings = {"trials": 4, **censor}
    defense = build_defense("censor", settings, "test", update_lr=0.1)
    shared = defense.shared_update(
        model, normalize(x, MEAN, STD), y, F.cross_entropy, torch.Generator().manual_seed(9)
    )
    return server, SharedUpdate(
        {k: v.detach() for k, v in shared.items()},
        "gradient",
        defended(update.meta, "censor", settings),
    )


def defended(meta, kind, settings):
    """The capture's public metadata, saying which defense the client ran and how."""
    return PublicMeta(
        **{**meta.__dict__, "defense": kind, "defense_kind": kind, "defense_settings": settings}
    )


def censor_samples(grads, n, generator, projection="exact", scope="layer-wise"):
    """n samples of CENSOR's transform of ``grads`` (a list), as the EOT attacker draws them."""
    censor = build_defense("censor", {"projection": projection, "scope": scope}, "test")
    drawn = censor.attacker_samples({str(i): g for i, g in enumerate(grads)}, n, generator)
    return [drawn[str(i)] for i in range(len(grads))]


def attack(settings, server, update, seed=0, progress=None):
    a = build_attack(
        "inverting_gradients", {"log_every": 1, **settings}, ThreatModel(labels="known"), where="a"
    )
    return a.reconstruct(server, update, torch.Generator().manual_seed(seed), progress=progress)


def dummy_gradient(x):
    """The tiny CNN's gradient at ``x`` with create_graph, as the attack builds it."""
    model = build_model(ModelSpec("cnn3", 10, 3, 16, {}), seed=0).eval()
    params = list(model.parameters())
    loss = F.cross_entropy(model(x), torch.tensor([2]))
    return list(torch.autograd.grad(loss, params, create_graph=True))


def cos(a, b):
    a, b = a.detach(), b.detach()
    return float((a * b).sum() / (a.norm() * b.norm()))


def reference_ig(server, update, seed, iterations, restarts, lr=0.1, tv=1e-4):
    """Inverting Gradients as it was before EOT (signed, boxed, known labels), written out."""
    model = build_model(server.model)
    model.load_state_dict(server.state)
    model.eval()
    params = list(model.parameters())
    target = [update.tensors[n] for n, _ in model.named_parameters()]
    labels = torch.tensor(update.meta.labels)
    mean, std = torch.tensor(MEAN).view(1, -1, 1, 1), torch.tensor(STD).view(1, -1, 1, 1)
    low, high = (0 - mean) / std, (1 - mean) / std
    generator = torch.Generator().manual_seed(seed)

    def distance(x):
        loss = F.cross_entropy(model(x), labels)
        dummy = torch.autograd.grad(loss, params, create_graph=True)
        return cosine_distance(list(dummy), target)

    best = None
    milestones = [int(iterations * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    for _ in range(restarts):
        x = torch.randn((1, 3, 16, 16), generator=generator).requires_grad_(True)
        opt = torch.optim.Adam([x], lr=lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
        for _ in range(iterations):
            opt.zero_grad()
            objective = distance(x) + tv * total_variation(x)
            (x.grad,) = torch.autograd.grad(objective, x)
            x.grad.sign_()
            opt.step()
            sched.step()
            with torch.no_grad():
                x.data = torch.max(torch.min(x, high), low)
        final = distance(x.detach()).item()
        if best is None or final < best[0]:
            best = (final, x.detach().clone())
    return denormalize(best[1], MEAN, STD).clamp(0, 1)


def test_eot_off_is_the_attack_as_before():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]), known=True)
    settings = {"iterations": 12, "restarts": 2}
    default = attack(settings, server, update)
    off = attack({**settings, "eot_samples": 0}, server, update)
    assert torch.equal(off.images, default.images)
    assert off.history == default.history and off.summary == default.summary
    assert torch.equal(off.images, reference_ig(server, update, 0, 12, 2))


def test_the_transform_is_censors_orthogonal_norm_matched_and_differentiable():
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    dummy = dummy_gradient(x)
    samples = censor_samples(dummy, 4, torch.Generator().manual_seed(0), "exact", "layer-wise")
    for g, s in zip(dummy, samples, strict=True):
        assert s.shape == (4, *g.shape)
        for k in range(4):
            assert abs(cos(s[k], g)) < 1e-5
            torch.testing.assert_close(s[k].norm(), g.norm(), rtol=1e-5, atol=1e-12)
        assert abs(cos(s[0], s[1])) < 0.9  # four different draws, not one repeated
    target = [torch.randn_like(g) for g in dummy]
    (grad,) = torch.autograd.grad(cosine_distances(samples, target).mean(), x)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_whole_model_scope_is_orthogonal_as_a_whole_only():
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    dummy = [g.detach() for g in dummy_gradient(x)]
    samples = censor_samples(dummy, 3, torch.Generator().manual_seed(0), "exact", "whole-model")
    flat_g = torch.cat([g.reshape(-1) for g in dummy])
    for k in range(3):
        flat_s = torch.cat([s[k].reshape(-1) for s in samples])
        assert abs(cos(flat_s, flat_g)) < 1e-5
        torch.testing.assert_close(flat_s.norm(), flat_g.norm(), rtol=1e-5, atol=0)
    assert max(abs(cos(s[0], g)) for s, g in zip(samples, dummy, strict=True)) > 1e-3


def test_as_coded_projection_keeps_a_component_along_a_small_gradient():
    g = [torch.randn(64, generator=torch.Generator().manual_seed(0)) * 1e-3]
    exact = censor_samples(g, 50, torch.Generator().manual_seed(1), "exact")[0]
    coded = censor_samples(g, 50, torch.Generator().manual_seed(1), "as-coded")[0]
    assert max(abs(cos(s, g[0])) for s in exact) < 1e-5
    assert sum(abs(cos(s, g[0])) for s in coded) / 50 > 0.05


def test_each_combine_mode_is_what_it_says():
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    dummy = [g.detach() for g in dummy_gradient(x)]
    target = [torch.randn(g.shape, generator=torch.Generator().manual_seed(2)) for g in dummy]
    samples = censor_samples(dummy, 5, torch.Generator().manual_seed(3))
    each = torch.stack([cosine_distance([s[k] for s in samples], target) for k in range(5)])
    torch.testing.assert_close(cosine_distances(samples, target), each)
    expected = {
        "average-gradient": cosine_distance([s.mean(0) for s in samples], target),
        "average-loss": each.mean(),
        "best-sample": each.min(),
    }
    got = {c: eot_distance(samples, target, cosine_distances, c) for c in COMBINES}
    for c in COMBINES:
        torch.testing.assert_close(got[c], expected[c])
    assert len({round(float(v), 6) for v in got.values()}) == 3


@pytest.mark.parametrize("combine", COMBINES)
def test_each_combine_mode_attacks_a_censor_update(combine):
    server, update = censored_case()
    settings = {"iterations": 6, "restarts": 2, "eot_samples": 3, "eot_combine": combine}
    result = attack(settings, server, update)
    assert result.images.shape == (1, 3, 16, 16)
    assert torch.isfinite(result.images).all()
    assert result.images.min() >= 0 and result.images.max() <= 1
    assert all(torch.isfinite(torch.tensor(v)) for _, v in result.history["loss_restart0"])
    off = attack({**settings, "eot_samples": 0}, server, update)
    assert not torch.equal(result.images, off.images)


def test_the_combine_modes_reconstruct_differently():
    server, update = censored_case()
    images = [
        attack({"iterations": 6, "restarts": 1, "eot_samples": 3, "eot_combine": c}, server, update)
        for c in COMBINES
    ]
    assert not torch.equal(images[0].images, images[1].images)
    assert not torch.equal(images[1].images, images[2].images)


@pytest.mark.parametrize("projection,scope", [("as-coded", "layer-wise"), ("exact", "whole-model")])
def test_the_attacker_samples_censor_as_the_capture_says_it_ran(projection, scope):
    server, update = censored_case(projection=projection, scope=scope)
    a = build_attack("inverting_gradients", {"eot_samples": 3}, ThreatModel(), where="a")
    names = list(update.tensors)
    grads = [update.tensors[n] for n in names]
    match = a.gradient_match(update, names, grads, cosine_distances)
    assert a.eot_note == "3 samples of censor, average-gradient"
    got = match.samples(grads, torch.Generator().manual_seed(4))
    expected = censor_samples(grads, 3, torch.Generator().manual_seed(4), projection, scope)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    other = "exact" if projection == "as-coded" else "as-coded"
    assert not torch.equal(
        got[1], censor_samples(grads, 3, torch.Generator().manual_seed(4), other, scope)[1]
    )
    result = attack({"iterations": 4, "restarts": 1, "eot_samples": 2}, server, update)
    assert torch.isfinite(result.images).all()


def test_eot_against_gaussian_noise_samples_the_noise_it_was_configured_with():
    x, y = photo_patch(16)[None], torch.tensor([2])
    _server, update = capture("cnn3", x, y, known=True)
    meta = defended(update.meta, "gaussian_noise", {"std": 0.5})
    noisy = SharedUpdate(update.tensors, "gradient", meta)
    a = build_attack("inverting_gradients", {"eot_samples": 200}, ThreatModel(), where="a")
    names = list(update.tensors)
    grads = [update.tensors[n].clone() for n in names]
    drawn = a.gradient_match(noisy, names, grads, cosine_distances).samples(
        grads, torch.Generator()
    )
    for g, d in zip(grads, drawn, strict=True):
        assert d.shape == (200, *g.shape)
        assert float((d - g).std()) == pytest.approx(0.5, rel=0.1)
    assert a.eot_note == "200 samples of gaussian_noise, average-gradient"


def test_eot_against_a_deterministic_defense_is_the_attack_without_it():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]), known=True)
    clipped = SharedUpdate(
        update.tensors, "gradient", defended(update.meta, "clipping", {"bound": 4.0})
    )
    a = build_attack(
        "inverting_gradients",
        {"iterations": 5, "restarts": 1, "eot_samples": 4},
        ThreatModel(labels="known"),
        where="a",
    )
    with_eot = a.reconstruct(server, clipped, torch.Generator().manual_seed(0))
    assert a.eot_note == "none, clipping is not randomized"
    assert torch.equal(
        with_eot.images, attack({"iterations": 5, "restarts": 1}, server, clipped).images
    )


@pytest.mark.parametrize("kind", ATTACKS.available())
def test_every_attack_can_run_eot_against_censor(kind):
    if ATTACKS.get(kind).server == "malicious":
        pytest.skip(
            "an analytic malicious-server attack (Imprint) compares no dummy gradient, so there "
            "is nothing to take EOT over; it refuses eot_samples > 0 (tests/test_imprint.py)"
        )
    server, update = censored_case()
    settings = few(kind, restarts=1, eot_samples=2, eot_combine="average-loss")
    a = ready(build_attack(kind, settings, ThreatModel(labels="known"), where="a"))
    result = a.reconstruct(server, update, torch.Generator().manual_seed(0))
    assert torch.isfinite(result.images).all()
    assert a.eot_note == "2 samples of censor, average-loss"


def test_the_same_seed_gives_the_same_eot_attack_and_another_seed_another():
    server, update = censored_case()
    settings = {"iterations": 6, "restarts": 2, "eot_samples": 3, "eot_combine": "average-loss"}
    a, b = attack(settings, server, update, 4), attack(settings, server, update, 4)
    c = attack(settings, server, update, 5)
    assert torch.equal(a.images, b.images)
    assert a.history == b.history and a.summary == b.summary
    assert not torch.equal(a.images, c.images)


@pytest.mark.parametrize("saves", [2, 5])  # midway, and after the last step
def test_an_interrupted_eot_attack_resumes_to_the_same_reconstruction(tmp_path, saves):
    server, update = censored_case()
    settings = {"iterations": 5, "restarts": 2, "eot_samples": 2}
    expected = attack(settings, server, update)
    with pytest.raises(Interrupted):
        attack(settings, server, update, progress=StopAfter(tmp_path / "p", saves))
    resumed = attack(
        settings, server, update, progress=Progress(tmp_path / "p", fingerprint="f", every=0)
    )
    assert torch.equal(resumed.images, expected.images)
    assert resumed.history == expected.history and resumed.summary == expected.summary


def test_eot_against_censor_with_public_directions_says_it_is_not_implemented():
    censor = build_defense("censor", {"source": "public"}, "test")
    with pytest.raises(NotImplementedError, match="source: public"):
        censor.attacker_samples({"w": torch.ones(3)}, 2, torch.Generator())
