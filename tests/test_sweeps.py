"""Issue 9's building blocks: defense sweeps, tables over several models, the frontier, the
attack success rate, and the settings the papers' own tables vary."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch

from gradinv.adaptive import shared_attacks
from gradinv.config import REPO_ROOT, load, table_models, table_victims, validate
from gradinv.metrics import MetricSettings
from gradinv.settings import ConfigError
from gradinv.stages.frontier import draw, frontier_points
from gradinv.stages.score import _success_rate
from gradinv.sweeps import shared_runs, sweep_points, sweep_variant, table_runs
from gradinv.table_inputs import (
    table_attack_files,
    table_files,
    table_score_files,
    table_utility_runs,
    table_victim_files,
)


@pytest.fixture(scope="module")
def base():
    return load(REPO_ROOT / "params.yaml")


def _with(base, **changes):
    config = copy.deepcopy(base)
    for key, value in changes.items():
        config[key] = value
    return config


def test_a_sweep_makes_one_defense_per_value_with_that_setting_and_a_label(base):
    noise = base["defenses"]["noise-std0.1"]
    assert noise["std"] == 0.1 and noise["kind"] == "gaussian_noise"
    assert noise["label"] == "Noise std=0.1"
    assert base["defenses"]["refiner_e01-element_weightfalse"]["element_weight"] is False
    assert base["defenses"]["refiner_e01-element_weightfalse"]["epsilon"] == 0.1  # its base's
    assert sweep_points(base)["precode-size32"] == ("precode", "size", 32)
    assert sweep_variant("dp_sgd", "noise_multiplier", 1.0) == "dp_sgd-noise_multiplier1"


def test_a_table_lists_its_sweeps_variants_after_its_own_defenses(base):
    fig6 = base["tables"]["refiner_fig6"]["defenses"]
    assert fig6[0] == "none"
    assert fig6[1:4] == ["noise-std0.001", "noise-std0.01", "noise-std0.1"]
    assert base["tables"]["refiner_table5_beta"]["defenses"] == [
        "refiner_e01-beta0.001",
        "refiner_e01-beta1",
        "refiner_e01-beta1000",
    ]


def test_validating_twice_changes_nothing(base):
    again = validate(copy.deepcopy(base))
    assert again["defenses"] == base["defenses"]
    assert again["tables"] == base["tables"]


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"defense": "nosie", "setting": "std", "values": [1.0]}, "Did you mean 'noise'"),
        ({"defense": "noise", "setting": "sdt", "values": [1.0]}, "not a setting of defense"),
    ],
)
def test_a_sweep_of_an_unknown_defense_or_setting_is_named(base, sweep, message):
    config = _with(base, sweeps={**base["sweeps"], "bad": sweep})
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_a_table_naming_an_unknown_sweep_is_an_error(base):
    config = copy.deepcopy(base)
    config["tables"]["refiner_fig9"]["sweeps"] = ["noise_sdt"]
    with pytest.raises(ConfigError, match=r"tables\.refiner_fig9\.sweeps: 'noise_sdt'.*noise_std"):
        validate(config)


def test_a_variant_clashing_with_a_defined_block_is_an_error(base):
    config = copy.deepcopy(base)
    config["defenses"]["noise-std0.1"] = {**config["defenses"]["noise"], "std": 0.5}
    with pytest.raises(ConfigError, match=r"'noise-std0\.1' is also defined"):
        validate(config)


def test_a_sweep_point_at_its_bases_value_reads_the_bases_runs(base):
    shared = shared_runs(base)
    assert base["defenses"]["noise"]["std"] == 0.01 and shared["noise-std0.01"] == "noise"
    assert "noise-std0.1" not in shared and "noise" not in shared
    # Refiner's Tables 5-8 and 10 sweep one base: their default rows are one run
    for point in ("beta1", "alpha0.5", "tau0.95", "iterations10", "element_weighttrue"):
        assert shared[f"refiner_e01-{point}"] == "refiner_e01"
    assert table_runs(base, "refiner_table5_beta") == [
        "refiner_e01-beta0.001",
        "refiner_e01",
        "refiner_e01-beta1000",
    ]
    fig6 = table_runs(base, "refiner_fig6")
    assert "noise" in fig6 and "noise-std0.01" not in fig6
    assert len(fig6) == len(set(fig6))
    runs = table_utility_runs(base, "refiner_table5_beta")
    assert "results/utility/common/patches/lenet/refiner_e01/seed0/summary.json" in runs
    assert not any("refiner_e01-beta1/" in r for r in runs)
    # a block defined under its own name runs under it, whatever its settings
    assert "noise_1e2" not in shared and base["defenses"]["noise_1e2"]["std"] == 0.01


def test_a_sweep_of_a_shared_point_reads_the_first_bases_runs():
    noise = {"kind": "gaussian_noise", "std": 0.01}
    config = {
        "defenses": {"noise": noise, "noise-std0.01": noise, "noise-std0.01-std0.01": noise},
        "sweeps": {
            "a": {"defense": "noise", "setting": "std", "values": [0.01]},
            "b": {"defense": "noise-std0.01", "setting": "std", "values": [0.01]},
        },
    }
    assert shared_runs(config) == {"noise-std0.01": "noise", "noise-std0.01-std0.01": "noise"}


def test_a_table_over_several_models_reads_each_models_training_runs(base):
    assert table_models(base, "cvb_table5") == ["cnn3", "resnet18_gn", "vit"]
    assert table_models(base, "table1") == ["cnn3"]
    runs = table_utility_runs(base, "cvb_table5")
    assert "results/utility/cvb/patches/vit/cvb/seed2/summary.json" in runs  # CVB's recipe
    assert "results/utility/cvb/patches/resnet18_gn/none/seed1/summary.json" in runs


def test_an_undefined_model_in_a_list_is_named(base):
    config = copy.deepcopy(base)
    config["tables"]["cvb_table5"]["model"] = ["cnn3", "vitt"]
    with pytest.raises(ConfigError, match=r"tables\.cvb_table5\.model: 'vitt'"):
        validate(config)


def test_the_paper_overlay_sweeps_the_papers_ranges():
    paper = load(REPO_ROOT / "params.yaml", (REPO_ROOT / "workflow/configs/paper.yaml",))
    beta = paper["tables"]["refiner_table5_beta"]["defenses"]
    assert len(beta) == 7 and beta[-1] == "refiner_e01-beta1000"
    assert table_models(paper, "refiner_fig10") == ["resnet10", "resnet18", "vit"]


def _cells(rows):
    return pd.DataFrame.from_records(
        [
            {
                "dataset": "p",
                "dataset_label": "P",
                "defense": d,
                "defense_label": d,
                "attack": a,
                "attack_label": a.upper(),
                "metric": m,
                "mean": v,
                "ci_low": None if v is None else v - 0.01,  # each cell's interval, as given
                "ci_high": None if v is None else v + 0.02,
                "n": 0 if v is None else 2,
            }
            for d, a, m, v in rows
        ]
    )


def test_the_frontier_takes_the_strongest_attack_for_each_metric():
    cells = _cells(
        [
            ("noise-std0.1", "ig", "psnr", 12.0),
            ("noise-std0.1", "ig_eot", "psnr", 15.0),  # EOT breaks it on PSNR
            ("noise-std0.1", "ig", "ssim", 0.40),
            ("noise-std0.1", "ig_eot", "ssim", 0.30),
            ("noise-std0.1", "ig", "lpips", 0.5),
            ("noise-std0.1", "ig_eot", "lpips", 0.2),  # lower LPIPS: the attacker's win
            ("noise-std0.1", "ig", "pmm", 0.9),
            ("noise-std0.1", "ig_eot", "pmm", 0.9),
            ("none", "ig", "psnr", 20.0),
            ("none", "ig", "ssim", None),  # no finished run: no point
            ("none", "ig", "pmm", 1.0),
        ]
    )
    points = frontier_points(
        cells, {"noise-std0.1": ["noise", "std", 0.1]}, {"noise": "Noise"}
    ).set_index("defense")
    noise = points.loc["noise-std0.1"]
    assert (noise["psnr"], noise["psnr_attack"]) == (15.0, "IG_EOT")
    # each value with the interval of the cell it comes from
    assert (noise["psnr_ci_low"], noise["psnr_ci_high"]) == (14.99, 15.02)
    assert (noise["pmm_ci_low"], noise["pmm_ci_high"]) == (0.89, 0.92)
    assert (noise["ssim"], noise["ssim_attack"]) == (0.40, "IG")
    assert (noise["lpips"], noise["lpips_attack"]) == (0.2, "IG_EOT")
    assert (noise["base"], noise["setting"], noise["value"], noise["pmm"]) == (
        "noise",
        "std",
        0.1,
        0.9,
    )
    assert points.loc["none", "base"] == "none" and math.isnan(points.loc["none", "ssim"])


def test_the_frontier_figure_says_when_its_runs_are_scaled_down(tmp_path):
    from PIL import Image

    cells = _cells([("none", "ig", "psnr", 20.0), ("none", "ig", "pmm", 1.0)])
    points = frontier_points(cells, {}, {"none": "No Defense"})
    for scale, says in (("embedded", "SCALED-DOWN run"), ("paper", "Scale: paper.")):
        draw(points, tmp_path / f"{scale}.png", {"scale": scale})
        with Image.open(tmp_path / f"{scale}.png") as img:
            assert says in img.text["Title"]


def test_attack_success_is_the_share_of_images_at_the_ssim_threshold():
    settings = MetricSettings(success_ssim=0.6)
    assert _success_rate([0.59, 0.6, 0.9, 0.1], settings) == 0.5
    assert _success_rate([0.2], settings) == 0.0
    assert _success_rate(None, settings) is None


def test_resnet_depth_gives_resnet10_18_and_34():
    from gradinv.models import build_model
    from gradinv.protocol import ModelSpec

    blocks = {
        d: [
            len(
                getattr(
                    build_model(ModelSpec("resnet18", 10, 3, 32, {"depth": d, "width": 8})),
                    f"layer{i}",
                )
            )
            for i in range(1, 5)
        ]
        for d in (10, 18, 34)
    }
    assert blocks == {10: [1, 1, 1, 1], 18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}  # He et al.'s stages


def test_refiner_without_the_element_wise_weight_weighs_by_layer_alone():
    from gradinv.defenses import build_defense

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    plain = build_defense("refiner", {"element_weight": False, "tau": 0.5}, where="t")
    weights = plain._weights(model, grads)
    assert torch.equal(weights["0.weight"], torch.full((3, 4), 0.5))
    assert torch.equal(weights["2.bias"], torch.full((2,), 0.25))
    full = build_defense("refiner", {"tau": 0.5}, where="t")._weights(model, grads)
    assert torch.allclose(full["0.weight"], (grads["0.weight"] * model[0].weight * 0.5).abs())


def test_dcs2_count_protects_the_first_samples_and_noise_follows_the_concealment():
    from gradinv.defenses import build_defense

    one = build_defense("dcs2", {"sensitive": "count", "count": 1}, where="t")
    assert one.sensitive_indices(torch.tensor([3, 1, 4, 1])) == [0]
    assert one.shared_batch_size(torch.tensor([3, 1, 4, 1])) == 5
    noisy = build_defense("dcs2", {"noise_std": 0.1}, where="t")
    grads = {"w": torch.zeros(1000)}
    out = noisy._noised(grads, torch.Generator().manual_seed(0))["w"]
    assert 0.09 < float(out.std()) < 0.11
    assert one._noised(grads, torch.Generator())["w"] is grads["w"]  # no noise: untouched


def test_a_frontier_panel_without_pmm_says_so_not_that_its_metric_is_missing(tmp_path, monkeypatch):
    import matplotlib.axes

    texts = []
    real = matplotlib.axes.Axes.text

    def text(self, x, y, s, *args, **kwargs):  # what each panel writes
        texts.append(s)
        return real(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "text", text)
    cells = _cells([("none", "ig", "psnr", 20.0), ("none", "ig", "pmm", None)])
    draw(frontier_points(cells, {}, {"none": "No Defense"}), tmp_path / "f.png", {"scale": "paper"})
    assert any(t.startswith("no PMM") for t in texts)  # PSNR is there; PMM is not
    assert not any(t.startswith("PSNR unavailable") for t in texts)


def test_an_adaptive_attack_with_nothing_to_adapt_to_reads_the_plain_attacks_runs(base):
    """EOT against a defense that is not randomized, the Ignore attack against one that adds no
    bottleneck: each is the plain attack (the frontier would otherwise take the best of several
    seeds of IG against some defenses only)."""
    attacks = base["tables"]["frontier_runs"]["attacks"]
    assert attacks == ["ig", "gi_aware", "ig_eot", "ig_ignore"]
    assert shared_attacks(base, "clipping", attacks) == {"ig_eot": "ig", "ig_ignore": "ig"}
    assert shared_attacks(base, "noise", attacks) == {"ig_ignore": "ig"}  # randomized
    assert shared_attacks(base, "cvb", attacks) == {"ig_eot": "ig"}  # a bottleneck
    stochastic = copy.deepcopy(base)
    stochastic["defenses"]["quantization"]["rounding"] = "stochastic"
    assert shared_attacks(stochastic, "quantization", attacks) == {"ig_ignore": "ig"}
    # the decoder-only Ignore attack names its layers: never read as another attack's
    cvb_attacks = base["tables"]["cvb_precode_ignore"]["attacks"]
    assert shared_attacks(base, "none", cvb_attacks) == {"ig_ignore": "ig"}
    files = table_files(base, "frontier_runs", "attacks", "pt")
    assert not [f for f in files if "/clipping/" in f and "/ig_eot/" in f]
    assert [f for f in files if "/noise/" in f and "/ig_eot/" in f]
    assert len(files) == len(set(files)) == len(table_victim_files(base, "frontier_runs"))
    # scored a cell at a time: one file per cell of the table's victims
    scores = table_score_files(base, "frontier_runs")
    victims = base["tables"]["frontier_runs"]["victims"]
    assert len(scores) * victims == len(files) and all(
        s.endswith(f"/v{victims}.json") for s in scores
    )
    # attacked victims_per_job at a time: a cell's first victims in one file, the rest in more
    attacks = table_attack_files(_with(base, victims_per_job=3), "frontier_runs")
    assert len(attacks) == len(scores) * -(-victims // 3)
    assert {a.rsplit("/", 1)[1] for a in attacks} == {
        f"victims{first}-{min(first + 3, victims) - 1}.pt" for first in range(0, victims, 3)
    }
    assert {a.rsplit("/", 1)[0] for a in attacks} == {
        s.replace("results/metrics/", "results/attacks/").rsplit("/", 1)[0] for s in scores
    }


def test_a_table_without_an_undefended_row_reads_another_tables_undefended_runs():
    """CENSOR's EOT table shows GIFD and GIFD+EOT under CENSOR only: whether GIFD works at all is
    Table I's undefended GIFD (against no defense EOT has nothing to average, so GIFD+EOT runs
    as GIFD); its rounds table reads round 0's, the only round attacked undefended."""
    from gradinv.table_inputs import undefended_score_files

    config = validate(copy.deepcopy(load(REPO_ROOT / "params.yaml")))
    n = table_victims(config, "table1")
    gifd = f"results/metrics/patches/cnn3/none/r0_b1/gifd/v{n}.json"
    assert undefended_score_files(config, "table3_eot") == [gifd]
    assert undefended_score_files(config, "table5_rounds") == [gifd]
    assert undefended_score_files(config, "table1") == []  # its own undefended row says it
