"""The generative-prior attacks (GGL, GIAS, GIFD) and the generator plumbing they need."""

from pathlib import Path

import numpy as np
import pytest
import torch

from generative import tiny_generator, trained_generator
from gradinv.attacks import AttackFailed, ThreatModel, build_attack
from gradinv.attacks.ggl import kl_to_standard_normal
from gradinv.attacks.gifd import gifd_lr, project_l1_ball, sphere_norm
from gradinv.generators import WeightsError, verified_weights
from gradinv.generators.dcgan import DCGAN, train_dcgan
from gradinv.generators.files import fetch_weights, load_generator, save_trained
from gradinv.io import sha256_file
from gradinv.progress import Progress
from interrupt import Interrupted, StopAfter
from test_attacks import capture, photo_patch, psnr

# Per attack: a run of many steps, the one-step run that stands for its initialisation, and
# what the long run must achieve against it: the gradient distance below `ratio` times the
# start's, the PSNR `gain` dB above it (measured with trained_generator(): GIAS and GIFD, which
# leave the generator's range, 0.37 -> 0.02-0.03 and 12 -> 19-22 dB). GGL only searches the
# latent of a generator that cannot draw the victim's patch: it lowers its objective a little
# (0.278 -> 0.270, 0.230 -> 0.224 with the generator trained on two threads) and its PSNR moves
# by +-0.1 dB either way with the generator's training (9.12 -> 9.23, 11.03 -> 10.94 dB), so
# only its objective is checked (gain None).
LONG_SHORT = {
    "ggl": (
        {"budget": 40, "population": 16, "restarts": 2},
        {"budget": 1, "population": 16, "restarts": 2},
        (0.99, None),
    ),
    "gias": (
        {"latent_iterations": 60, "param_iterations": 60, "restarts": 2, "latent_lr": 0.1},
        {"latent_iterations": 1, "param_iterations": 0, "restarts": 2},
        (0.5, 3.0),
    ),
    "gifd": (
        {"iterations": 60, "restarts": 2, "radii": [0.0, 200.0, 400.0]},
        {"iterations": 1, "restarts": 2, "stages": 1},
        (0.5, 3.0),
    ),
}


def run(kind, settings, server, update, seed=0, generator=None):
    attack = build_attack(kind, {**settings, "log_every": 10}, ThreatModel(), where="a")
    attack.use_generator(generator or trained_generator())
    return attack.reconstruct(server, update, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", sorted(LONG_SHORT))
def test_every_generative_attack_beats_its_initialisation(kind):
    """A 16x16 photograph on the tiny CNN, a tiny generator with random weights: the attack
    must match the gradient better and come closer to the image than where it started."""
    x = photo_patch(16)[None]
    server, update = capture("cnn3", x, torch.tensor([2]))
    long, short, (ratio, gain) = LONG_SHORT[kind]
    end, start = run(kind, long, server, update), run(kind, short, server, update)
    assert end.labels.tolist() == [2]
    assert end.summary["gradient_distance"] < ratio * start.summary["gradient_distance"]
    if gain is not None:
        assert psnr(end.images, x) > psnr(start.images, x) + gain


def test_generative_attacks_are_deterministic_for_a_seed():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]))
    small_runs = {
        "ggl": {"budget": 3, "population": 4, "restarts": 2},
        "gias": {"latent_iterations": 3, "param_iterations": 3, "restarts": 2},
        "gifd": {"iterations": 3, "restarts": 2},
    }
    for kind, small in small_runs.items():
        a = run(kind, small, server, update, generator=tiny_generator())
        b = run(kind, small, server, update, generator=tiny_generator())
        assert torch.equal(a.images, b.images), kind
        assert a.summary == b.summary, kind


def test_gifd_picks_the_stage_and_restart_with_the_lowest_gradient_distance():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]))
    settings = {"iterations": 20, "restarts": 3, "radii": [0.0, 50.0, 50.0]}
    result = run("gifd", settings, server, update, generator=tiny_generator())
    stages = result.summary["stage_distances"]
    assert len(stages) == tiny_generator().num_blocks
    assert result.summary["best_stage"] == int(np.argmin(stages))
    assert result.summary["gradient_distance"] == pytest.approx(min(stages))
    last = run("gifd", {**settings, "output": "last"}, server, update, generator=tiny_generator())
    assert last.summary["returned_restart"] == 2


def test_a_generative_attack_without_a_generator_fails_loudly():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]))
    attack = build_attack("gifd", {"iterations": 1}, ThreatModel(), where="a")
    with pytest.raises(AttackFailed, match="no generator"):
        attack.reconstruct(server, update, torch.Generator())


def test_a_label_outside_the_generators_classes_needs_a_label_map():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([7]))
    attack = build_attack("ggl", {"budget": 1, "population": 4}, ThreatModel(), where="a")
    small = DCGAN.build(DCGAN.Settings(latent_dim=8, width=8), 16, 3, 5).eval()
    attack.use_generator(small)
    with pytest.raises(AttackFailed, match="label_map"):
        attack.reconstruct(server, update, torch.Generator())
    attack.use_generator(small, label_map=[0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    assert attack.reconstruct(server, update, torch.Generator()).labels.tolist() == [7]


def test_l1_ball_projection_is_the_euclidean_projection():
    """Against the definition: a point inside stays; outside, the result lies on the sphere of
    the ball and no random point of the ball is closer to the input."""
    torch.manual_seed(0)
    v = torch.randn(3, 20) * 3
    p = project_l1_ball(v, 5.0)
    assert torch.allclose(p.abs().sum(1), torch.full((3,), 5.0), atol=1e-4)
    inside = torch.randn(1, 20) * 0.01
    assert torch.equal(project_l1_ball(inside, 5.0), inside)
    for _ in range(200):
        q = torch.randn(3, 20)
        q = q / q.abs().sum(1, keepdim=True) * 5.0 * torch.rand(3, 1)
        assert ((v - p).norm(dim=1) <= (v - q).norm(dim=1) + 1e-5).all()


def test_spherical_norms_and_the_gifd_learning_rate_ramp():
    z = torch.randn(2, 8)
    assert sphere_norm(z).shape == (2, 1)
    assert sphere_norm(torch.randn(2, 18, 4)).shape == (2, 18, 1)
    assert gifd_lr(0.0, 0.1) == 0.0 and gifd_lr(0.05, 0.1) == pytest.approx(0.1)
    assert gifd_lr(0.25, 0.1) == pytest.approx(0.1) and gifd_lr(1.0, 0.1) == pytest.approx(0.0)
    assert gifd_lr(0.625, 0.1) == pytest.approx(0.05)


def test_the_kl_term_is_zero_for_standard_normal_moments_only():
    z = torch.randn(1, 100000, generator=torch.Generator().manual_seed(0))
    assert float(kl_to_standard_normal(z)) == pytest.approx(0.0, abs=1e-3)
    assert float(kl_to_standard_normal(3 * z + 1)) > 1.0


def test_dcgan_training_learns_the_data_and_round_trips_through_its_file(tmp_path):
    """A few steps on two flat colours: the generator's class means move toward them
    (measured 0.63 and 0.11 for 0.9 and 0.1)."""
    images = torch.cat([torch.full((16, 3, 8, 8), 0.9), torch.full((16, 3, 8, 8), 0.1)])
    labels = torch.tensor([0] * 16 + [1] * 16)
    settings = DCGAN.Settings(
        latent_dim=8, width=8, steps=150, batch_size=16, lr=1e-3, ema=0.9, log_every=50
    )
    model, history = train_dcgan(settings, images, labels, 2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = (model(torch.randn(32, 8), torch.tensor([0, 1]).repeat(16)) + 1) / 2
    assert out[0::2].mean() > out[1::2].mean() + 0.2
    assert history["loss_d"] and all(np.isfinite(v) for _, v in history["loss_d"])
    path = tmp_path / "g.pt"
    save_trained(path, "dcgan", "dcgan", model, num_classes=2)
    block = {"kind": "dcgan", "label": "x", "datasets": ["d"], "latent_dim": 8, "width": 8}
    again = load_generator("dcgan", block, path)
    z = torch.randn(4, 8)
    assert torch.equal(again(z, torch.tensor([0, 1, 0, 1])), model(z, torch.tensor([0, 1, 0, 1])))


def test_missing_or_wrong_weights_name_the_expected_sha256_and_the_source(tmp_path):
    good = tmp_path / "w.bin"
    good.write_bytes(b"published weights")
    digest = sha256_file(good)
    src = "https://example.org/w.bin"
    assert verified_weights(good, digest, src, "g") == good
    with pytest.raises(WeightsError, match=f"does not exist.*{src}.*{digest}"):
        verified_weights(tmp_path / "missing.bin", digest, src, "g")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"something else")
    with pytest.raises(WeightsError, match=f"expected {digest}.*{src}"):
        verified_weights(bad, digest, src, "g")


def test_fetching_weights_verifies_them_and_leaves_nothing_wrong_behind(tmp_path, server):
    payload = b"weights of a generator" * 100
    import hashlib

    digest = hashlib.sha256(payload).hexdigest()
    url = server.serve("w.bin", payload)
    out = tmp_path / "gen" / "weights.pt"
    block = {"kind": "biggan", "url": url, "sha256": digest, "source": "test"}
    assert fetch_weights("g", block, out) == out and out.read_bytes() == payload
    out.unlink()
    with pytest.raises(WeightsError, match=f"expected {'0' * 64}"):
        fetch_weights("g", {**block, "sha256": "0" * 64}, out)
    assert not out.exists() and list(out.parent.iterdir()) == []
    local = tmp_path / "copy.bin"
    local.write_bytes(payload)
    assert fetch_weights("g", {**block, "url": "", "local_path": str(local)}, out) == out
    with pytest.raises(WeightsError, match="does not exist"):
        fetch_weights("g", {**block, "local_path": str(tmp_path / "nope")}, tmp_path / "o.pt")


def test_a_relative_local_path_is_the_projects_wherever_the_run_writes(tmp_path, monkeypatch):
    """The fetch job runs in its run's folder (an overlay's run_dir); the copy of the weights
    params.yaml names is the user's, in the project."""
    import hashlib

    from gradinv.stages.generator import fetch

    payload = b"published weights" * 10
    project, run = tmp_path / "project", tmp_path / "project" / "runs" / "paper"
    (project / "data/raw").mkdir(parents=True)
    (project / "data/raw/w.bin").write_bytes(payload)
    run.mkdir(parents=True)
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(project))
    monkeypatch.chdir(run)
    block = {"kind": "biggan", "url": "", "local_path": "data/raw/w.bin", "source": "test"}
    block["sha256"] = hashlib.sha256(payload).hexdigest()
    fetch({"generator_name": "g", "generator": block}, Path("data/generators/g/weights.pt"))
    assert (run / "data/generators/g/weights.pt").read_bytes() == payload


@pytest.mark.parametrize(
    ("kind", "saves"),
    [("ggl", 2), ("gias", 2), ("gias", 5), ("gifd", 2), ("gifd", 4), ("gifd", 5)],
)
def test_an_interrupted_generative_attack_resumes_to_the_same_reconstruction(tmp_path, kind, saves):
    """Killed after ``saves`` saved steps (within the first stage or the second, GIAS's weights,
    GIFD's later stages), resumed: the same images, history and summary as an uninterrupted
    run. GGL rebuilds CMA-ES by replaying what it was told."""
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([2]))
    settings = {
        "ggl": {"budget": 4, "population": 4, "restarts": 2},
        "gias": {"latent_iterations": 3, "param_iterations": 3, "restarts": 2},
        "gifd": {"iterations": 3, "restarts": 2, "radii": [0.0, 20.0, 40.0]},
    }[kind]

    def attack(progress=None):
        a = build_attack(kind, settings, ThreatModel(), where="a")
        a.use_generator(tiny_generator())
        return a.reconstruct(server, update, torch.Generator().manual_seed(0), progress=progress)

    expected = attack()
    with pytest.raises(Interrupted):
        attack(StopAfter(tmp_path / "p", saves))
    resumed = attack(Progress(tmp_path / "p", fingerprint="f", every=0))
    assert torch.equal(resumed.images, expected.images)
    assert resumed.history == expected.history and resumed.summary == expected.summary


def test_the_generator_job_trains_on_the_device_it_takes(tmp_path, monkeypatch, capfd):
    """train_generator asks the scheduler for a GPU (gradinv.cluster.DEVICE_RULES), so it must
    train there: it once held its GPU token while training on the CPU (1 step/s on an H100)."""
    import gradinv.stages.generator as stage
    from stages import Stages

    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    stages = Stages(tmp_path, generators__dcgan__steps=2, generators__dcgan__log_every=1)
    assert stages.prepare() == 0 and stages.partition_data() == 0
    taken = []
    real = stage.acquire_device

    def recording(requested, *args, **kwargs):
        taken.append(requested)
        return real(requested, *args, **kwargs)

    monkeypatch.setattr(stage, "acquire_device", recording)
    seen = []
    monkeypatch.setattr(
        stage, "train_dcgan", lambda *a, **k: seen.append(a[-1]) or train_dcgan(*a, **k)
    )
    out = tmp_path / "data/generators/dcgan/patches.pt"
    from gradinv.cli import main

    argv = ["train-generator", "--settings", stages.settings("generator", generator="dcgan")]
    argv += ["--prepared-dir", str(stages.prepared.parent), "--partition", str(stages.partition)]
    assert main([*argv, "--out", str(out)]) == 0
    assert taken == [stages.config["device"]]
    assert seen == [torch.device("cpu")]  # the device acquire_device gave
    assert "gradinv: device cpu" in capfd.readouterr().err
    assert out.exists() and out.with_name("patches_samples.png").exists()
