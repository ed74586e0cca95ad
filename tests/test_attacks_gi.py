"""GradInversion (gradinv.attacks.gradinversion): reconstruction, group consistency, BN prior,
labels, failure, determinism and resume, on tiny models in a few seconds each."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from skimage import data, transform

import gradinv.attacks.gradinversion  # noqa: F401  (registers "gradinversion")
from gradinv.attacks import AttackFailed, ThreatModel, build_attack
from gradinv.attacks.gradinversion import GradInversion
from gradinv.defenses import gradients_of
from gradinv.models import build_model
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate, normalize
from interrupt import Interrupted, StopAfter

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def photo_patches(size: int, n: int) -> torch.Tensor:
    """n size x size patches of a real photograph (scikit-image's cat) in [0, 1]."""
    img = transform.resize(data.chelsea(), (4 * size, 4 * size), anti_aliasing=True)
    img = torch.tensor(img, dtype=torch.float32).permute(2, 0, 1)
    corners = [(size, size), (2 * size, size), (size, 2 * size), (2 * size, 2 * size)]
    return torch.stack([img[:, i : i + size, j : j + size] for i, j in corners[:n]])


def capture(
    model_name, images, labels, *, mode="eval", kind="gradient", known=False, settings=None
):
    """The server's message and a client's update (a gradient, or a one-step FedAvg delta)."""
    spec = ModelSpec(model_name, 10, 3, images.shape[-1], settings or {})
    model = build_model(spec, seed=0)
    if mode == "train":  # non-trivial running statistics, as after some rounds of training
        with torch.no_grad():
            model.train()(torch.rand(16, 3, images.shape[-1], images.shape[-1]) * 2 - 1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train(mode == "train")
    grads = gradients_of(model, normalize(images, MEAN, STD), labels, F.cross_entropy)
    lr = 0.1
    tensors = {k: v.detach() if kind == "gradient" else -lr * v.detach() for k, v in grads.items()}
    meta = PublicMeta(
        **dict(dataset="test", batch_size=len(labels), image_shape=tuple(images.shape[1:])),
        **dict(num_classes=10, mean=MEAN, std=STD, model_mode=mode, defense="none"),
        **dict(defense_kind="none", defense_settings={}, local_steps=1),
        local_lr=lr if kind == "delta" else 0.0,
        labels=tuple(labels.tolist()) if known else None,
    )
    return ServerMessage(spec, state, 0), SharedUpdate(tensors, kind, meta)


def run(server, update, seed=0, threat=None, progress=None, **settings):
    attack = build_attack("gradinversion", settings, threat or ThreatModel(), where="test")
    generator = torch.Generator().manual_seed(seed)
    return attack.reconstruct(server, update, generator, progress=progress)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * np.log10(1 / ((a - b) ** 2).mean().item()))


FAST = dict(restarts=2, group_start=100, group_every=20, log_every=50)


def test_group_consistency_pulls_the_restarts_together():
    server, update = capture("cnn3", photo_patches(16, 1), torch.tensor([2]))
    common = dict(iterations=150, restarts=3, group_start=20, group_every=10, log_every=50)
    apart = run(server, update, group=0.0, **common).summary["group_spread"]
    together = run(server, update, group=0.5, **common)
    assert together.summary["group_spread"] < 0.25 * apart  # measured: 0.038 against 0.45
    fused = run(server, update, group=0.5, output="group-mean", **common)
    assert together.summary["best_restart"] in range(3)
    assert 0 < (fused.images - together.images).abs().max() < 0.1


def test_bn_prior_is_off_by_default_and_on_changes_the_result():
    assert GradInversion.Settings().bn_prior == 0
    server, update = capture(
        "convnet", photo_patches(9, 1), torch.tensor([3]), settings={"width": 4}
    )
    off = run(server, update, iterations=10, **FAST)
    on = run(server, update, iterations=10, bn_prior=0.1, **FAST)
    assert not torch.allclose(off.images, on.images, atol=1e-3)
    plain = capture("cnn3", photo_patches(16, 1), torch.tensor([3]))
    with pytest.raises(ValueError, match="batch norm"):
        run(*plain, iterations=1, bn_prior=0.1)


def test_vmap_and_loop_over_restarts_agree():
    """The batched restarts are the same attack as a loop over them (BN model, BN prior on)."""
    server, update = capture(
        "convnet", photo_patches(9, 2), torch.tensor([3, 5]), settings={"width": 4}
    )
    common = dict(iterations=8, restarts=3, bn_prior=0.1, group_start=2, group_every=2)
    batched = run(server, update, restarts_layout="batched", **common)
    looped = run(server, update, restarts_layout="sequential", **common)
    assert (batched.summary["restarts_layout"], looped.summary["restarts_layout"]) == (
        "batched",
        "sequential",
    )
    assert torch.allclose(batched.images, looped.images, atol=1e-4)
    distances = (batched.summary["gradient_distance"], looped.summary["gradient_distance"])
    assert distances[0] == pytest.approx(distances[1], rel=1e-3)


def test_train_mode_with_batch_norm_loops_over_the_restarts():
    server, update = capture(
        "convnet", photo_patches(9, 2), torch.tensor([1, 6]), mode="train", settings={"width": 4}
    )
    before = {k: v.clone() for k, v in server.state.items()}
    threat = ThreatModel(model_mode="train")
    result = run(
        server, update, threat=threat, iterations=5, bn_prior=0.1, restarts_layout="batched"
    )
    assert result.summary["restarts_layout"] == "sequential"
    assert result.labels.tolist() == [1, 6]
    assert all(torch.equal(before[k], v) for k, v in server.state.items())


def test_a_fedavg_delta_is_matched_as_the_gradient_of_one_step():
    x, y = photo_patches(16, 2), torch.tensor([4, 8])
    from_gradient = run(*capture("cnn3", x, y), iterations=20, **FAST)
    from_delta = run(*capture("cnn3", x, y, kind="delta"), iterations=20, **FAST)
    assert from_delta.labels.tolist() == [4, 8]
    assert torch.allclose(from_delta.images, from_gradient.images, atol=1e-3)


def test_labels_are_recovered_for_a_batch_of_distinct_labels():
    server, update = capture("cnn3", photo_patches(16, 4), torch.tensor([7, 1, 4, 9]))
    assert run(server, update, iterations=1).labels.tolist() == [1, 4, 7, 9]
    server, update = capture("cnn3", photo_patches(16, 2), torch.tensor([7, 1]), known=True)
    known = run(server, update, threat=ThreatModel(labels="known"), iterations=1)
    assert known.labels.tolist() == [7, 1]


def test_a_non_finite_target_fails_the_attack_loudly():
    server, update = capture("cnn3", photo_patches(16, 1), torch.tensor([1]), known=True)
    broken = SharedUpdate(
        {k: torch.full_like(v, float("nan")) for k, v in update.tensors.items()},
        "gradient",
        update.meta,
    )
    with pytest.raises(AttackFailed, match="non-finite"):
        run(server, broken, threat=ThreatModel(labels="known"), iterations=5)


def test_the_same_seed_gives_the_same_reconstruction():
    server, update = capture("cnn3", photo_patches(16, 1), torch.tensor([5]))
    first, again = (run(server, update, seed=3, iterations=30, **FAST) for _ in range(2))
    other = run(server, update, seed=4, iterations=30, **FAST)
    assert torch.equal(first.images, again.images) and first.history == again.history
    assert not torch.equal(first.images, other.images)


# Before the group mean exists, after refreshes, and after the last step (Langevin noise on).
@pytest.mark.parametrize("saves", [3, 9, 14, 16])
def test_an_interrupted_attack_resumes_to_the_same_reconstruction(tmp_path, saves):
    server, update = capture("cnn3", photo_patches(16, 2), torch.tensor([0, 5]))
    settings = dict(iterations=16, restarts=3, group_start=5, group_every=4, log_every=3)
    settings.update(langevin=0.2, warmup=4)
    expected = run(server, update, **settings)
    with pytest.raises(Interrupted):
        run(server, update, progress=StopAfter(tmp_path / "p", saves), **settings)
    resumed = run(
        server, update, progress=Progress(tmp_path / "p", fingerprint="f", every=0), **settings
    )
    assert torch.equal(resumed.images, expected.images)
    assert resumed.history == expected.history and resumed.summary == expected.summary
