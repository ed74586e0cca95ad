"""Tests of gradinv.metrics: every registered metric, hand-computed values, matching, LPIPS offline.

No test reaches the network: an autouse fixture makes every download path raise. LPIPS runs on a
fake AlexNet backbone (random tensors of the right shapes, saved under its own hash), with the
expected torchvision file name patched to that hash; the real names are checked separately.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

import gradinv.metrics.lpips as lpips_metric
from gradinv.io import sha256_file
from gradinv.metrics import (
    METRICS,
    MetricSettings,
    label_accuracy,
    match_reconstructions,
    score,
)
from gradinv.metrics.lpips import BackboneSpec, LPIPSUnavailableWarning
from gradinv.registry import RegistryError
from gradinv.settings import ConfigError, from_mapping, settings_schema

ALL_METRICS = METRICS.available()
# noise_ratio scores a reconstruction alone (no reference) with a trained network: the tests of
# a reconstruction against its original do not apply; tests/test_evalnet.py covers it.
REFERENCE_METRICS = [name for name in ALL_METRICS if name != "noise_ratio"]
LABELS = {
    "mse": ("MSE", "up"),
    "psnr": ("PSNR", "down"),
    "ssim": ("SSIM", "down"),
    "lpips": ("LPIPS", "up"),
    "noise_ratio": ("NoiseRatio", "up"),
}


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to download (weights or anything else) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:1]}")

    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="session")
def fake_alexnet(tmp_path_factory) -> tuple[Path, str]:
    """A torchvision-layout AlexNet checkpoint (features only) with random weights."""
    gen = torch.Generator().manual_seed(1)
    features = torchvision.models.alexnet(weights=None).features
    state = {
        f"features.{k}": torch.randn(v.shape, generator=gen) * 0.05
        for k, v in features.state_dict().items()
    }
    tmp = tmp_path_factory.mktemp("weights") / "alexnet.pth"
    torch.save(state, tmp)
    prefix = sha256_file(tmp)[:8]
    path = tmp.with_name(f"alexnet-owt-{prefix}.pth")
    tmp.rename(path)
    return path, prefix


@pytest.fixture
def lpips_settings(monkeypatch, fake_alexnet) -> MetricSettings:
    """Settings whose LPIPS (alex) loads the fake backbone; the expected hash is patched to it."""
    path, prefix = fake_alexnet
    spec = BackboneSpec(net="alex", filename=path.name, url="(test)", hash_prefix=prefix)
    monkeypatch.setattr(lpips_metric, "backbone_spec", lambda net: spec)
    return MetricSettings(lpips_net="alex", lpips_weights_path=str(path))


def images(n: int = 2, c: int = 3, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, c, size, size, generator=torch.Generator().manual_seed(seed))


def perturb(x: torch.Tensor, scale: float, seed: int = 1) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    return (x + scale * noise).clamp(0, 1)


# ------------------------------------------------------------------- every registered metric


def test_registry_holds_the_four_metrics_with_censors_arrows():
    assert sorted(LABELS) == ALL_METRICS
    for name in ALL_METRICS:
        cls = METRICS.get(name)
        assert (cls.name, (cls.label, cls.defender_direction)) == (name, LABELS[name])


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name", REFERENCE_METRICS)
def test_identical_images_score_best(name, channels, lpips_settings):
    x = images(c=channels)
    result = METRICS.get(name)().per_image(x, x.clone(), lpips_settings)
    assert result.status == "ok"
    assert len(result.per_image) == 2
    best = METRICS.get(name).best
    for v in result.per_image:
        assert v == best if math.isinf(best) else v == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name", REFERENCE_METRICS)
def test_worse_reconstruction_scores_worse_for_the_attacker(name, channels, lpips_settings):
    x = images(n=3, c=channels)
    metric = METRICS.get(name)()
    good = metric.per_image(perturb(x, 0.03), x, lpips_settings).per_image
    bad = metric.per_image(perturb(x, 0.3), x, lpips_settings).per_image
    assert len(good) == len(bad) == 3 and all(isinstance(v, float) for v in good + bad)
    for g, b in zip(good, bad, strict=True):
        # "up": higher is better privacy, so the worse reconstruction scores higher.
        assert (b > g) if metric.defender_direction == "up" else (b < g)


@pytest.mark.parametrize("name", REFERENCE_METRICS)
def test_score_reports_mean_and_per_image(name, lpips_settings):
    x = images(n=4)
    out = score(perturb(x, 0.1), x, metrics=[name], settings=lpips_settings)
    assert len(out[f"{name}_per_image"]) == 4
    assert out[name] == pytest.approx(np.mean(out[f"{name}_per_image"]))
    assert out["matching"] == [0, 1, 2, 3]


# ----------------------------------------------------------------------- MSE and PSNR by hand


def test_mse_and_psnr_against_hand_computed_values():
    recon = torch.tensor([[[[0.1, 0.2], [0.3, 0.4]]], [[[0.5, 0.5], [0.5, 0.5]]]])
    orig = torch.zeros_like(recon)
    out = score(recon, orig, metrics=["mse", "psnr"], settings=MetricSettings(match=False))
    # (0.01 + 0.04 + 0.09 + 0.16) / 4 = 0.075 and 0.25; PSNR = 10 log10(1 / MSE).
    assert out["mse_per_image"] == pytest.approx([0.075, 0.25])
    assert out["psnr_per_image"] == pytest.approx([11.249387366083, 6.020599913280])
    assert out["mse"] == pytest.approx(0.1625)
    assert out["psnr"] == pytest.approx((11.249387366083 + 6.020599913280) / 2)


def test_mse_averages_over_channels():
    recon = torch.zeros(1, 3, 2, 2)
    recon[0, 0] = 1.0  # one channel of three fully wrong: MSE 1/3
    out = score(recon, torch.zeros_like(recon), metrics=["mse", "psnr"], settings=MetricSettings())
    assert out["mse"] == pytest.approx(1 / 3)
    assert out["psnr"] == pytest.approx(10 * math.log10(3))


def test_exact_match_gives_infinite_psnr_and_mean():
    x = images(n=2)
    recon = x.clone()
    recon[1] = perturb(x[1:], 0.1)[0]
    out = score(recon, x, metrics=["psnr"], settings=MetricSettings(match=False))
    assert out["psnr_per_image"][0] == math.inf
    assert math.isfinite(out["psnr_per_image"][1])
    assert out["psnr"] == math.inf  # kept, not capped (see psnr.py)


# ------------------------------------------------------------------------------------ SSIM


def gaussian_window_np(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    g = np.exp(-((np.arange(size) - size // 2) ** 2) / (2 * sigma**2))
    w = np.outer(g, g)
    return w / w.sum()


def ssim_reference(x: np.ndarray, y: np.ndarray, zero_pad: bool) -> float:
    """Independent loop implementation of Wang et al.'s Gaussian-window SSIM on one channel.

    ``zero_pad=False``: the mean over the windows that lie inside the image (skimage);
    ``zero_pad=True``: windows at every pixel, the image padded with zeros (CENSOR's code).
    """
    w, r = gaussian_window_np(), 5
    c1, c2 = 0.01**2, 0.03**2
    if zero_pad:
        x, y = np.pad(x, r), np.pad(y, r)
    vals = []
    for i in range(r, x.shape[0] - r):
        for j in range(r, x.shape[1] - r):
            px, py = (
                x[i - r : i + r + 1, j - r : j + r + 1],
                y[i - r : i + r + 1, j - r : j + r + 1],
            )
            mx, my = (w * px).sum(), (w * py).sum()
            vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
            cxy = (w * (px - mx) * (py - my)).sum()
            vals.append(
                (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
            )
    return float(np.mean(vals))


def ssim_reference_batch(recon, orig, zero_pad):
    a, b = recon.double().numpy(), orig.double().numpy()
    return [
        np.mean([ssim_reference(a[n, c], b[n, c], zero_pad) for c in range(a.shape[1])])
        for n in range(a.shape[0])
    ]


@pytest.mark.parametrize("impl", ["skimage", "censor_code"])
@pytest.mark.parametrize("channels", [1, 3])
def test_ssim_matches_an_independent_implementation(impl, channels):
    x = images(n=2, c=channels, size=16)
    y = perturb(x, 0.2)
    got = METRICS.get("ssim")().per_image(y, x, MetricSettings(ssim_impl=impl)).per_image
    expected = ssim_reference_batch(y, x, zero_pad=impl == "censor_code")
    assert got == pytest.approx(expected, abs=1e-10)


def test_ssim_normalized_space_uses_mean_std_normalized_tensors():
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as CENSOR's data
    x = images(n=1, size=16)
    y = perturb(x, 0.2)
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    for impl in ("skimage", "censor_code"):
        settings = MetricSettings(space="normalized", ssim_impl=impl)
        out = score(y, x, metrics=["ssim"], settings=settings, mean=mean, std=std)
        expected = ssim_reference_batch((y - m) / s, (x - m) / s, zero_pad=impl == "censor_code")
        assert out["ssim_per_image"] == pytest.approx(expected, abs=1e-6)
    unit = score(y, x, metrics=["ssim"], settings=MetricSettings())["ssim"]
    assert out["ssim"] != pytest.approx(unit, abs=1e-3)  # the choice matters


def test_normalized_space_needs_mean_and_std():
    x = images(n=1, size=16)
    with pytest.raises(ValueError, match="mean and std"):
        score(x, x, metrics=["ssim"], settings=MetricSettings(space="normalized"))
    with pytest.raises(ValueError, match="one entry per channel"):
        score(
            x,
            x,
            metrics=["ssim"],
            settings=MetricSettings(space="normalized"),
            mean=(0.5,),
            std=(0.5,),
        )


def test_ssim_rejects_images_smaller_than_its_window():
    x = images(n=1, size=8)
    with pytest.raises(ValueError, match="11x11"):
        score(x, x, metrics=["ssim"], settings=MetricSettings())


# -------------------------------------------------------------------------------- matching


@pytest.mark.parametrize("cost", ["mse", "ssim"])
def test_hungarian_matching_recovers_a_known_permutation(cost):
    orig = images(n=6, size=16)
    perm = [3, 0, 5, 1, 4, 2]
    recon = perturb(orig[perm], 0.05)
    got = match_reconstructions(recon, orig, cost=cost)
    assert [perm[i] for i in got] == list(range(6))  # recon[got] lines up with orig
    assert torch.allclose(recon[got], orig, atol=0.25)


def test_score_matches_before_scoring_unless_told_not_to():
    orig = images(n=5, size=16)
    perm = [4, 2, 0, 3, 1]
    recon = perturb(orig[perm], 0.05)
    matched = score(recon, orig, metrics=["mse"], settings=MetricSettings())
    unmatched = score(recon, orig, metrics=["mse"], settings=MetricSettings(match=False))
    assert [perm[i] for i in matched["matching"]] == list(range(5))
    assert unmatched["matching"] == list(range(5))
    assert matched["mse"] < 0.01 < unmatched["mse"]


def test_matching_on_lpips_fails_loudly_when_lpips_is_unavailable():
    x = images(n=2)
    with (
        pytest.raises(RuntimeError, match="cannot match on lpips"),
        pytest.warns(LPIPSUnavailableWarning),
    ):
        score(x, x, metrics=["mse"], settings=MetricSettings(match_cost="lpips"))


# ---------------------------------------------------------------------------------- LPIPS


def test_backbone_names_are_those_of_the_installed_torchvision():
    import torchvision

    for net, (enum_name, url) in lpips_metric._TORCHVISION_WEIGHTS.items():
        assert getattr(torchvision.models, enum_name).IMAGENET1K_V1.url == url, net
    vgg, alex = lpips_metric.backbone_spec("vgg"), lpips_metric.backbone_spec("alex")
    assert (vgg.filename, vgg.hash_prefix) == ("vgg16-397923af.pth", "397923af")
    assert (alex.filename, alex.hash_prefix) == ("alexnet-owt-7be5be79.pth", "7be5be79")
    assert Path(torch.hub.get_dir()) / "checkpoints" / vgg.filename == (
        lpips_metric.hub_checkpoint_path(vgg)
    )


def test_lpips_without_weights_is_unavailable_and_never_builds_a_network(monkeypatch, caplog):
    def no_build(*args, **kwargs):
        raise AssertionError("a network was built without verified weights")

    import lpips

    monkeypatch.setattr(lpips, "LPIPS", no_build)
    x = images(n=2)
    with (
        pytest.warns(LPIPSUnavailableWarning, match="vgg16-397923af.pth"),
        caplog.at_level(logging.WARNING),
    ):
        out = score(x, perturb(x, 0.1), metrics=["psnr", "lpips"], settings=MetricSettings())
    assert out["lpips"] is None and out["lpips_per_image"] is None
    status = out["lpips_status"]
    assert status.startswith("unavailable: ")
    assert "lpips_weights_path" in status and str(torch.hub.get_dir()) in status
    assert "vgg16-397923af.pth" in caplog.text
    assert math.isfinite(out["psnr"])  # the other metrics are unaffected


def test_lpips_status_is_recorded_even_when_not_requested():
    x = images(n=1)
    out = score(x, x, metrics=["mse"], settings=MetricSettings())
    assert out["lpips_status"] == "not requested" and "lpips" not in out


def test_lpips_rejects_a_file_whose_hash_does_not_match_its_name():
    path = Path(torch.hub.get_dir()) / "checkpoints" / "vgg16-397923af.pth"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not the VGG16 weights")
    with pytest.warns(LPIPSUnavailableWarning, match="sha256"):
        result = METRICS.get("lpips")().per_image(images(), images(), MetricSettings())
    assert result.per_image is None
    assert result.status.startswith("unavailable: ") and "397923af" in result.status


def test_lpips_reports_a_missing_configured_path(tmp_path):
    settings = MetricSettings(lpips_weights_path=str(tmp_path / "nowhere.pth"))
    with pytest.warns(LPIPSUnavailableWarning, match="nowhere.pth"):
        result = METRICS.get("lpips")().per_image(images(), images(), settings)
    assert "metrics.lpips_weights_path" in result.status


def test_lpips_loads_a_verified_backbone_from_the_hub_cache(lpips_settings, fake_alexnet):
    path, _ = fake_alexnet
    cached = Path(torch.hub.get_dir()) / "checkpoints" / path.name
    cached.parent.mkdir(parents=True)
    shutil.copy(path, cached)
    settings = MetricSettings(lpips_net="alex")  # no configured path: the cache is searched
    x = images(n=2)
    out = score(perturb(x, 0.2), x, metrics=["lpips"], settings=settings)
    assert out["lpips_status"] == "ok" and out["lpips"] > 0
    # Every backbone tensor comes from the file, none from the random initialization.
    net = lpips_metric.get_network("alex", cached, x.device)
    state = torch.load(cached, weights_only=True)
    for key, value in net.net.state_dict().items():
        _, index, param = key.split(".")
        assert torch.equal(value, state[f"features.{index}.{param}"])


def test_lpips_network_is_built_once_per_process(lpips_settings, monkeypatch):
    calls = []
    real = lpips_metric.build_network
    monkeypatch.setattr(lpips_metric, "build_network", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(lpips_metric, "_NETWORKS", {})
    x = images(n=2)
    for _ in range(3):
        METRICS.get("lpips")().per_image(x, perturb(x, 0.1), lpips_settings)
    assert len(calls) == 1


def test_lpips_input_scaling_in_both_spaces(lpips_settings):
    x = images(n=2)
    y = perturb(x, 0.2)
    net = lpips_metric.get_network("alex", Path(lpips_settings.lpips_weights_path), x.device)
    metric = METRICS.get("lpips")()
    with torch.no_grad():
        unit = net(2 * y - 1, 2 * x - 1).flatten().tolist()
        mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
        m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
        normalized = net((y - m) / s, (x - m) / s).flatten().tolist()
    assert metric.per_image(y, x, lpips_settings).per_image == pytest.approx(unit, rel=1e-5)
    settings = dataclasses.replace(lpips_settings, space="normalized")
    got = metric.per_image(y, x, settings, mean, std).per_image
    assert got == pytest.approx(normalized, rel=1e-5)


def test_lpips_repeats_grey_images_to_three_channels(lpips_settings):
    x = images(n=2, c=1)
    y = perturb(x, 0.2)
    metric = METRICS.get("lpips")()
    grey = metric.per_image(y, x, lpips_settings).per_image
    rgb = metric.per_image(y.repeat(1, 3, 1, 1), x.repeat(1, 3, 1, 1), lpips_settings).per_image
    assert grey == pytest.approx(rgb, rel=1e-6)


# --------------------------------------------------------------------------- label accuracy


@pytest.mark.parametrize(
    ("predicted", "true", "expected"),
    [
        ([3, 1, 2], [1, 2, 3], 1.0),  # order does not matter
        ([1, 2, 2], [1, 1, 2], 2 / 3),  # multiset: one of the two 1s is missed
        ([5], [4], 0.0),
        ([7, 7, 7, 7], [7, 0, 7, 1], 0.5),
        (torch.tensor([2, 0]), torch.tensor([0, 2]), 1.0),
    ],
)
def test_label_accuracy(predicted, true, expected):
    assert label_accuracy(predicted, true) == pytest.approx(expected)


def test_label_accuracy_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        label_accuracy([], [])
    with pytest.raises(TypeError, match="integer"):
        label_accuracy([0.5], [1])
    with pytest.raises(TypeError, match="integer"):
        label_accuracy(torch.tensor([1.0]), [1])


def test_score_label_accuracy():
    x = images(n=2, size=16)
    s = MetricSettings()
    out = score(x, x, metrics=["mse"], settings=s, predicted_labels=[1, 1], true_labels=[1, 2])
    assert out["label_accuracy"] == 0.5
    assert score(x, x, metrics=["mse"], settings=s, true_labels=[1, 2])["label_accuracy"] is None
    with pytest.raises(ValueError, match="true_labels"):
        score(x, x, metrics=["mse"], settings=s, predicted_labels=[1, 2])


# ------------------------------------------------------------------------ inputs and settings


@pytest.mark.parametrize(
    ("recon", "match"),
    [
        (torch.full((1, 3, 16, 16), 1.5), "clamp"),
        (torch.full((1, 3, 16, 16), float("nan")), "NaN"),
        (torch.zeros(1, 3, 8, 8), "differ in shape"),
        (torch.zeros(1, 2, 16, 16), "C in"),
        (torch.zeros(3, 16, 16), "shape"),
    ],
)
def test_score_rejects_invalid_images(recon, match):
    with pytest.raises(ValueError, match=match):
        score(recon, torch.zeros(1, 3, 16, 16), metrics=["mse"], settings=MetricSettings())


def test_score_rejects_unknown_or_malformed_metric_lists():
    x = images(n=1)
    with pytest.raises(RegistryError, match="Did you mean 'psnr'"):
        score(x, x, metrics=["pnsr"], settings=MetricSettings())
    with pytest.raises(TypeError, match="list of names"):
        score(x, x, metrics="psnr", settings=MetricSettings())
    with pytest.raises(ValueError, match="twice"):
        score(x, x, metrics=["mse", "mse"], settings=MetricSettings())


def test_settings_follow_the_project_conventions():
    s = from_mapping(MetricSettings, {"lpips_net": "alex", "space": "normalized"}, "metrics")
    assert (s.lpips_net, s.space, s.match) == ("alex", "normalized", True)
    with pytest.raises(ConfigError, match="did you mean 'space'"):
        from_mapping(MetricSettings, {"spaces": "unit"}, "metrics")
    with pytest.raises(ConfigError, match="lpips_net"):
        from_mapping(MetricSettings, {"lpips_net": "squeeze"}, "metrics")
    schema = settings_schema(MetricSettings)
    assert schema["properties"]["lpips_net"]["enum"] == ["vgg", "alex"]
    assert schema["additionalProperties"] is False
