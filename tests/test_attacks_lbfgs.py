"""The L-BFGS attacks: DLG, iDLG and CPL (one loop in gradinv.attacks.dlg)."""

import pytest
import torch
import torch.nn.functional as F

import gradinv.attacks.cpl
import gradinv.attacks.dlg
import gradinv.attacks.idlg  # noqa: F401  (registers the three attacks)
from gradinv.attacks import AttackFailed, ThreatModel, build_attack
from gradinv.attacks.dlg import initial_images
from gradinv.progress import Progress
from gradinv.protocol import PublicMeta, SharedUpdate
from interrupt import Interrupted, StopAfter
from test_attacks import capture, photo_patch, psnr

KINDS = ["dlg", "idlg", "cpl"]
FAST = {"max_iter": 5}  # five evaluations per L-BFGS step: enough to test the loop's bookkeeping


def run(kind, server, update, settings, threat=None, seed=0, progress=None):
    attack = build_attack(kind, settings, threat or ThreatModel(), where="test")
    generator = torch.Generator().manual_seed(seed)
    return attack.reconstruct(server, update, generator, progress=progress)


def test_dlg_recovers_the_label_jointly_from_a_random_start():
    x = photo_patch(16)[None]
    g = torch.Generator().manual_seed(0)
    torch.randn((1, 3, 16, 16), generator=g)  # the dummy image's draw, then the dummy label's
    start = int(torch.randn((1, 10), generator=g).argmax())
    label = (start + 3) % 10
    server, update = capture("cnn3", x, torch.tensor([label]))
    result = run("dlg", server, update, {"iterations": 3, **FAST})
    assert result.labels.tolist() == [label] != [start]


def test_dlg_uses_known_labels_and_needs_them_in_the_capture():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([4]), known=True)
    result = run("dlg", server, update, {"iterations": 1, **FAST}, ThreatModel(labels="known"))
    assert result.labels.tolist() == [4]
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([4]))
    with pytest.raises(AttackFailed, match="carries none"):
        run("dlg", server, update, {"iterations": 1}, ThreatModel(labels="known"))


@pytest.mark.parametrize("kind", ["idlg", "cpl"])
def test_idlg_and_cpl_use_the_label_read_from_the_gradient(kind):
    for label in (0, 5, 9):
        server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([label]))
        result = run(kind, server, update, {"iterations": 1, "max_iter": 1})
        assert result.labels.tolist() == [label]


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_of_two_keeps_shapes_and_labels(kind):
    x = torch.stack([photo_patch(16), photo_patch(16).flip(-1)])
    server, update = capture("cnn3", x, torch.tensor([1, 5]))
    result = run(kind, server, update, {"iterations": 2, **FAST})
    assert result.images.shape == x.shape
    assert result.labels.shape == (2,)
    if kind != "dlg":  # the row rule of Yin et al.; DLG's joint labels need more steps
        assert result.labels.tolist() == [1, 5]


def test_a_fedavg_delta_is_attacked_as_the_gradient_of_one_step():
    x = photo_patch(16)[None]
    server, update = capture("cnn3", x, torch.tensor([2]))
    meta = PublicMeta(**{**update.meta.__dict__, "local_lr": 0.1, "local_steps": 1})
    delta = SharedUpdate({k: -0.1 * v for k, v in update.tensors.items()}, "delta", meta)
    result = run("idlg", server, delta, {"iterations": 10})
    assert result.labels.tolist() == [2]
    assert psnr(result.images, x) > 20  # measured 30.8 dB (31.5 dB from the gradient)


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_in_train_mode_is_attacked_in_train_mode(kind):
    x = photo_patch(16)[None]
    server, update = capture("convnet", x, torch.tensor([2]))  # batch norm: train mode matters
    threat = ThreatModel(model_mode="train")
    a = run(kind, server, update, {"iterations": 1, **FAST}, threat)
    b = run(kind, server, update, {"iterations": 1, **FAST}, threat)
    assert torch.isfinite(a.images).all()
    assert torch.equal(a.images, b.images)
    # batch norm on the batch's statistics is another model than on its running ones: attacked
    # in eval mode, the same update leads elsewhere (so train mode was really used above)
    c = run(kind, server, update, {"iterations": 1, **FAST}, ThreatModel(model_mode="eval"))
    assert not torch.equal(a.images, c.images)


@pytest.mark.parametrize("kind", KINDS)
def test_a_nan_gradient_fails_the_attack_loudly(kind):
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([1]))
    broken = SharedUpdate(
        {k: torch.full_like(v, float("nan")) for k, v in update.tensors.items()},
        "gradient",
        update.meta,
    )
    with pytest.raises(AttackFailed, match="non-finite"):
        run(kind, server, broken, {"iterations": 5})


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_seed_gives_the_same_reconstruction(kind):
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([6]))
    settings = {"iterations": 2, "restarts": 2, **FAST}
    a = run(kind, server, update, settings, seed=3)
    b = run(kind, server, update, settings, seed=3)
    c = run(kind, server, update, settings, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.history == b.history and a.summary == b.summary
    assert not torch.equal(a.images, c.images)


# In the first restart, and in the second (which must start from the same random draws).
@pytest.mark.parametrize("saves", [2, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_an_interrupted_attack_resumes_to_the_same_reconstruction(tmp_path, capsys, kind, saves):
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([6]))
    settings = {"iterations": 3, "restarts": 2, "log_every": 1, **FAST}
    expected = run(kind, server, update, settings)
    with pytest.raises(Interrupted):
        run(kind, server, update, settings, progress=StopAfter(tmp_path / "p", saves))
    progress = Progress(tmp_path / "p", fingerprint="f", every=0)
    resumed = run(kind, server, update, settings, progress=progress)
    assert "resuming from saved progress" in capsys.readouterr().err
    assert torch.equal(resumed.images, expected.images)
    assert torch.equal(resumed.labels, expected.labels)
    assert resumed.history == expected.history and resumed.summary == expected.summary


def test_cpl_without_its_regulariser_and_seed_is_idlg():
    server, update = capture("cnn3", photo_patch(16)[None], torch.tensor([7]))
    common = {"iterations": 2, "init": "gaussian", **FAST}
    cpl = run("cpl", server, update, {**common, "label_reg": 0.0})
    idlg = run("idlg", server, update, common)
    assert torch.equal(cpl.images, idlg.images)
    with_reg = run("cpl", server, update, {**common, "label_reg": 1.0})
    assert not torch.equal(with_reg.images, idlg.images)


@pytest.mark.parametrize(
    "on, expected",
    [("logits", 0.5), ("probabilities", None), ("logits_minus_index", 0.5 * 3**0.5)],
)
def test_cpl_regulariser_is_the_weighted_euclidean_distance_to_the_label(on, expected):
    attack = build_attack("cpl", {"label_reg": 0.5, "label_reg_on": on}, ThreatModel(), "test")
    logits = torch.tensor([[0.0, 2.0, 0.0]])  # label 1: one-hot (0, 1, 0), or 1 in every entry
    value = attack._regularizer(logits, torch.tensor([1])).item()
    if expected is None:
        p = F.softmax(logits, -1)[0]
        expected = 0.5 * float((p - torch.tensor([0.0, 1.0, 0.0])).norm())
    assert value == pytest.approx(expected)


def test_patterned_init_repeats_one_tile_per_image():
    x = initial_images("patterned", (2, 3, 16, 16), torch.Generator().manual_seed(0))
    assert torch.equal(x[..., :8, :8], x[..., 8:, 8:])
    assert torch.equal(x[..., :8, :8], x[..., 8:, :8])
    assert not torch.equal(x[0], x[1])
    assert x.min() >= 0 and x.max() <= 1
    odd = initial_images("patterned", (1, 3, 15, 15), torch.Generator(), pattern_size=4)
    assert odd.shape == (1, 3, 15, 15) and torch.equal(odd[..., :3, :3], odd[..., 12:, 12:])
