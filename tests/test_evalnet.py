"""Refiner's evaluation network: architecture, training, file, the noise_ratio metric, stage."""

from __future__ import annotations

import functools
import itertools
import math
import sqlite3
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gradinv.cli import main
from gradinv.io import CorruptFileError, load_tensors, save_tensors
from gradinv.metrics import METRICS, MetricSettings, score
from gradinv.metrics.evaluation_network import (
    EvaluationNetwork,
    EvaluationNetworkSettings,
    EvaluationNetworkUnavailableWarning,
    calibration,
    load_evaluation_network,
    mix_with_noise,
    resolve_evaluation_network,
    save_evaluation_network,
    train_evaluation_network,
)
from gradinv.progress import Progress
from gradinv.tables.aggregate import METRICS as TABLE_METRICS
from interrupt import Interrupted, StopAfter
from stages import Stages

RATIOS = torch.linspace(0, 1, 11)


# ------------------------------------------------------------------------------ architecture


def test_three_stride_two_convolutions_of_width_2w_4w_then_one_sigmoid_unit():
    net = EvaluationNetwork(3, 32, width=16)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 64]
    assert all((c.kernel_size, c.stride, c.padding) == ((3, 3), (2, 2), (1, 1)) for c in convs)
    assert sum(isinstance(m, nn.ReLU) for m in net.modules()) == 3
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(64 * 4 * 4, 1)]
    # The paper's width: 128, 256, 512 filters; at 32x32 RGB (3*9+1)*128 + (128*9+1)*256
    # + (256*9+1)*512 + 512*4*4 + 1 parameters.
    full = EvaluationNetwork(3, 32)
    assert sum(p.numel() for p in full.parameters()) == 1_487_105


@pytest.mark.parametrize(("channels", "side"), [(3, 32), (1, 28), (3, 16)])
def test_output_is_one_ratio_in_0_1_per_image(channels, side):
    net = EvaluationNetwork(channels, side, width=4)
    out = net(torch.rand(5, channels, side, side))
    assert out.shape == (5,) and bool(((out >= 0) & (out <= 1)).all())
    with pytest.raises(ValueError, match=r"\(N, 3, 32, 32\).*use the network trained"):
        EvaluationNetwork(3, 32, width=4)(torch.rand(2, 1, 32, 32))


def test_the_gradient_reaches_the_input_through_two_uses_of_one_graph():
    """Refiner's defense backpropagates D into the image it optimises."""
    net = EvaluationNetwork(3, 16, width=4).requires_grad_(False)
    x = torch.rand(2, 3, 16, 16, requires_grad=True)
    y = net(x)
    (y.sum() + (y * y).sum()).backward()  # no in-place op spoils the saved activations
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_mixing_with_noise():
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mix_with_noise(x, 0.0, torch.Generator().manual_seed(1)), x)
    pure = mix_with_noise(x, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(pure, mix_with_noise(1 - x, 1.0, torch.Generator().manual_seed(1)))
    assert not torch.equal(pure[:, 0], pure[:, 1])  # noise per channel, not per pixel
    half = mix_with_noise(x, torch.tensor([0.0, 0.5, 0.5, 1.0]), torch.Generator().manual_seed(1))
    assert torch.equal(half[0], x[0]) and torch.allclose(half[1], (x[1] + pure[1]) / 2)
    assert float(half.min()) >= 0 and float(half.max()) <= 1


def test_settings_defaults_are_appendix_d():
    s = EvaluationNetworkSettings()
    assert (s.width, s.epochs, s.batch_size, s.lr, s.ratios) == (128, 20, 128, 1e-4, 11)


# ------------------------------------------------------------------------------- acceptance


def _crops(photo: np.ndarray, n: int, gen: torch.Generator, side: int = 16) -> torch.Tensor:
    """``n`` random side x side crops of a photograph downscaled to 96x96, in [0, 1]."""
    from skimage import transform

    if photo.ndim == 2:
        photo = np.stack([photo] * 3, -1)
    image = torch.tensor(transform.resize(photo, (96, 96), anti_aliasing=True)).float()
    image = image.permute(2, 0, 1)
    corners = torch.randint(0, 96 - side + 1, (n, 2), generator=gen).tolist()
    return torch.stack([image[:, i : i + side, j : j + side] for i, j in corners])


@functools.cache
def trained() -> tuple[EvaluationNetwork, torch.Tensor, list[tuple[int, float]]]:
    """A small D (width 16) trained for 4 epochs (about 3 s) on 320 crops of four of
    scikit-image's photographs; held out: 64 crops of a fifth photograph, the cat, which
    training never saw."""
    from skimage import data

    gen = torch.Generator().manual_seed(0)
    photos = (data.astronaut(), data.coffee(), data.rocket(), data.camera())
    train = torch.cat([_crops(p, 80, gen) for p in photos])
    held_out = _crops(data.chelsea(), 64, gen)
    s = EvaluationNetworkSettings(width=16, epochs=4, batch_size=32, lr=1e-3, log_every=11)
    net, history = train_evaluation_network(train, s, torch.Generator().manual_seed(0))
    return net, held_out, history["loss"]


def test_trained_network_predicts_more_noise_in_noisier_held_out_images():
    """Mean prediction over held-out images at each true ratio 0, 0.1, ..., 1 rises strictly.
    Measured (seed 0): 0.11, 0.12, 0.15, 0.20, 0.30, 0.43, 0.56, 0.69, 0.81, 0.88, 0.93; over
    seeds 0-3 the smallest step (always 0 -> 0.1) was 0.006 to 0.016."""
    net, held_out, losses = trained()
    rows = calibration(net, held_out, RATIOS, torch.Generator().manual_seed(1))
    means = [r["mean"] for r in rows]
    assert [r["ratio"] for r in rows] == pytest.approx(RATIOS.tolist())
    assert all(b > a for a, b in itertools.pairwise(means)), means
    assert means[-1] - means[0] > 0.6 and means[0] < 0.3 and means[-1] > 0.8
    assert all(0 <= r["std"] < 0.5 for r in rows)
    assert losses[-1][1] < losses[0][1]  # the cross-entropy (floor: H(r) > 0) went down
    assert not net.training and not any(p.requires_grad for p in net.parameters())


def test_an_interrupted_training_resumes_to_the_same_network(tmp_path):
    """Killed after its second saved batch (mid-epoch) and run again: the same weights and
    history, bit for bit, as an uninterrupted run."""
    images = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    s = EvaluationNetworkSettings(width=4, epochs=2, batch_size=16, lr=1e-3, ratios=5, log_every=3)

    def run(progress=None):
        return train_evaluation_network(images, s, torch.Generator().manual_seed(0), progress)

    expected, expected_history = run()
    for saves in (2, 3):  # mid-epoch, and at the epoch's end (the next order is drawn anew)
        folder = tmp_path / f"p{saves}"
        with pytest.raises(Interrupted):
            run(StopAfter(folder, saves))
        resumed, history = run(Progress(folder, fingerprint="f", every=0))
        assert history == expected_history
        for (k, a), b in zip(
            expected.state_dict().items(), resumed.state_dict().values(), strict=True
        ):
            assert torch.equal(a, b), k


# ------------------------------------------------------------------------------------ files


def test_the_file_round_trips_frozen_and_names_its_command_when_missing(tmp_path):
    net, held_out, _ = trained()
    path = tmp_path / "evalnet" / "patches.pt"
    save_evaluation_network(path, net, dataset="patches", history={"loss": [(1, 0.5)]})
    again = load_evaluation_network(path)
    assert not again.training and not any(p.requires_grad for p in again.parameters())
    assert torch.equal(again(held_out), net(held_out))
    assert load_tensors(path)["history"] == {"loss": [(1, 0.5)]}
    with pytest.raises(FileNotFoundError, match=r"nowhere\.pt.*snakemake data/evalnet/<dataset>"):
        load_evaluation_network(tmp_path / "nowhere.pt")
    with pytest.raises(FileNotFoundError, match=r"snakemake data/evalnet/cifar10\.pt --cores 1"):
        load_evaluation_network(tmp_path / "evalnet" / "cifar10.pt")
    with pytest.raises(ValueError, match="the file's own"):
        save_evaluation_network(path, net, width=3)


def test_a_truncated_or_foreign_file_is_corrupt(tmp_path):
    net, _, _ = trained()
    path = tmp_path / "evalnet" / "patches.pt"
    save_evaluation_network(path, net)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptFileError, match="forcerun train_evalnet"):
        load_evaluation_network(path)
    save_tensors(path, {"kind": "dcgan", "state": {}})
    with pytest.raises(CorruptFileError, match="not an evaluation network file"):
        load_evaluation_network(path)


# ----------------------------------------------------------------------------------- metric


def test_noise_ratio_is_registered_as_a_privacy_metric_of_the_tables():
    cls = METRICS.get("noise_ratio")
    assert (cls.label, cls.defender_direction, cls.best, cls.reports_status) == (
        "NoiseRatio",
        "up",
        0.0,
        True,
    )
    assert (TABLE_METRICS["noise_ratio"].label, TABLE_METRICS["noise_ratio"].arrow) == (
        "NoiseRatio",
        "↑",
    )


@pytest.mark.parametrize("configured", ["", "nowhere/patches.pt"])
def test_without_a_network_file_the_metric_is_unavailable_never_a_number(
    configured, tmp_path, monkeypatch
):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    x = torch.rand(2, 3, 16, 16)
    with pytest.warns(EvaluationNetworkUnavailableWarning, match="recorded as None"):
        out = score(
            x,
            x,
            metrics=["mse", "noise_ratio"],
            settings=MetricSettings(evaluation_network=configured, match=False),
        )
    assert out["noise_ratio"] is None and out["noise_ratio_per_image"] is None
    assert out["mse"] == 0.0
    status = out["noise_ratio_status"]
    assert status.startswith("unavailable: ") and "snakemake data/evalnet/" in status
    if configured:
        assert str(tmp_path / configured) in status


def test_the_metric_scores_each_image_and_noise_above_a_clean_photo(tmp_path):
    net, held_out, _ = trained()
    path = tmp_path / "evalnet.pt"
    save_evaluation_network(path, net)
    settings = MetricSettings(evaluation_network=str(path))
    clean = held_out[:4]
    noisy = mix_with_noise(clean, 0.9, torch.Generator().manual_seed(2))
    metric = METRICS.get("noise_ratio")()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # available: nothing to warn about
        a = metric.per_image(clean, clean, settings)
        b = metric.per_image(noisy, clean, settings)
    assert a.status == b.status == "ok" and len(a.per_image) == len(b.per_image) == 4
    assert all(0 <= v <= 1 for v in a.per_image + b.per_image)
    assert all(n > c for n, c in zip(b.per_image, a.per_image, strict=True))
    # No reference: the original is not read.
    assert metric.per_image(noisy, torch.zeros_like(clean), settings) == b
    out = score(noisy, clean, metrics=["noise_ratio"], settings=settings)
    assert out["noise_ratio_status"] == "ok"
    assert out["noise_ratio"] == pytest.approx(math.fsum(b.per_image) / 4)
    with pytest.raises(ValueError, match="use the network trained for this dataset"):
        metric.per_image(clean[:, :1], clean[:, :1], settings)


def test_the_metric_reports_a_corrupted_network_file(tmp_path):
    net, held_out, _ = trained()
    path = tmp_path / "evalnet.pt"
    save_evaluation_network(path, net)
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(CorruptFileError):
        METRICS.get("noise_ratio")().per_image(
            held_out[:2], held_out[:2], MetricSettings(evaluation_network=str(path))
        )


def test_an_empty_setting_means_the_datasets_own_network(tmp_path, monkeypatch):
    """The run's own network (in its folder, wherever the job runs); a given path is the user's."""
    monkeypatch.setenv("GRADINV_RUN_ROOT", str(tmp_path / "runs" / "micro"))
    empty = resolve_evaluation_network(MetricSettings(), "patches")
    assert empty.evaluation_network == str(tmp_path / "runs/micro/data/evalnet/patches.pt")
    given = MetricSettings(evaluation_network="mine.pt")
    assert resolve_evaluation_network(given, "patches") is given


# ------------------------------------------------------------------------------------ stage


def test_the_stage_trains_on_the_public_split_and_draws_its_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    tiny = {
        f"evaluation_network__{k}": v for k, v in dict(width=4, epochs=1, batch_size=64).items()
    }
    stages = Stages(tmp_path, **tiny)
    assert stages.prepare() == 0 and stages.partition_data() == 0
    out = tmp_path / "data/evalnet/patches.pt"
    argv = [
        "train-evalnet",
        "--settings",
        stages.settings("evalnet", dataset="patches"),
        "--prepared-dir",
        str(stages.prepared.parent),
        "--partition",
        str(stages.partition),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    saved = load_tensors(out)
    assert saved["public_images"] == 120  # 20% of the micro config's 40 train patches x 15
    assert saved["calibration_images"] == 150  # every validation patch (fewer than 300)
    assert [r["ratio"] for r in saved["calibration"]] == pytest.approx(RATIOS.tolist())
    assert saved["settings"]["width"] == 4 and saved["provenance"]["data_sha256"]
    assert len(saved["history"]["loss"]) >= 2
    net = load_evaluation_network(out)
    assert (net.in_channels, net.image_size, net.width) == (3, 32, 4)
    png = out.with_name("patches_calibration.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "results/.progress/data/evalnet").exists()  # finished: removed
    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # conftest's tracking store
        runs = db.execute(
            "select k.value, j.value from tags k join tags j on k.run_uuid = j.run_uuid "
            "where k.key = 'gradinv.kind' and j.key = 'gradinv.job_key'"
        ).fetchall()
    assert runs == [("train_evalnet", "evalnet/patches")]

    no_public = Stages(tmp_path, partition__public_fraction=0.0, **tiny)
    assert no_public.partition_data() == 0
    argv[2] = no_public.settings("evalnet", dataset="patches")
    assert main(argv) == 2  # a configuration error that names the fix


def test_training_on_public_data_needs_a_public_split_of_this_very_dataset(monkeypatch):
    """The evaluation network and the attacker's generator train on the public split: none is
    a config error naming the key to change; a partition of another dataset version, a rerun."""
    from types import SimpleNamespace

    import gradinv.data
    from gradinv.settings import ConfigError
    from gradinv.stages.common import public_split

    ds = SimpleNamespace(name="patches", sha256="abc", train_labels=[0] * 6)
    settings = {"partition": {"public_fraction": 0.0}}
    monkeypatch.setattr(gradinv.data, "read_partition", lambda p, n: ([], {"data_sha256": "abc"}))
    monkeypatch.setattr(gradinv.data, "read_public", lambda p, n: [])
    with pytest.raises(ConfigError, match=r"evaluation_network: .*public_fraction above 0"):
        public_split(settings, ds, "part.json", "evaluation_network")
    monkeypatch.setattr(gradinv.data, "read_public", lambda p, n: [3, 4])
    assert public_split(settings, ds, "part.json", "generators.dcgan") == [3, 4]
    monkeypatch.setattr(gradinv.data, "read_partition", lambda p, n: ([], {"data_sha256": "old"}))
    with pytest.raises(RuntimeError, match="another version of patches; rerun snakemake"):
        public_split(settings, ds, "part.json", "generators.dcgan")
