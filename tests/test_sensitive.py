"""A table with DCS² scores every defense on DCS²'s sensitive samples: the rule, the workflow's
choice per score job, and the score stage."""

import copy
import dataclasses
import json

import pytest
import torch

from gradinv.config import REPO_ROOT, load, validate
from gradinv.defenses import build_defense
from gradinv.defenses.dcs2 import DCS2
from gradinv.io import save_tensors
from gradinv.jobs import job_settings
from gradinv.metrics import MetricSettings
from gradinv.sensitive import DEFAULTS, rule_of, sensitive_samples, whole_batch
from gradinv.settings import ConfigError
from gradinv.stages.score import score_run

PARAMS = load(REPO_ROOT / "params.yaml")


@pytest.mark.parametrize(
    "rule",
    [
        {"sensitive": "count", "count": 1},
        {"sensitive": "count", "count": 3},
        {"sensitive": "fraction", "fraction": 0.5},
        {"sensitive": "fraction", "fraction": 0.2},
        {"sensitive": "labels", "labels": [0, 2]},
        {"sensitive": "labels", "labels": [7]},
    ],
)
def test_the_score_stage_and_the_defense_read_the_same_rule(rule):
    labels = [0, 1, 2, 0, 5]
    dcs2 = build_defense("dcs2", rule, where="defenses.dcs2")
    assert sensitive_samples(rule, labels) == dcs2.sensitive_indices(torch.tensor(labels))


def test_a_rule_covers_the_whole_batch_only_by_count_or_fraction():
    assert whole_batch({"sensitive": "count", "count": 1}, 1)
    assert not whole_batch({"sensitive": "count", "count": 1}, 2)
    assert whole_batch({"sensitive": "fraction", "fraction": 0.5}, 1)
    assert not whole_batch({"sensitive": "labels", "labels": [0]}, 1)  # class 0 need not be drawn


def _score_settings(config, defense, bs, attack="ig", model="lenet"):
    w = dict(dataset="patches", model=model, defense=defense, round="0", bs=bs, attack=attack)
    return json.loads(job_settings(config, "score", **w))


def test_a_table_with_dcs2_scores_its_other_defenses_on_the_sensitive_samples():
    config = validate(copy.deepcopy(PARAMS))
    # dcs2_table1: LeNet, batches of 2 (Imprint: 4), DCS² conceals the first image of each
    for defense in ("none", "sparsi_dcs2", "soteria_dcs2"):
        for bs, attack in (("2", "dlg"), ("4", "imprint")):
            on = _score_settings(config, defense, bs, attack=attack)["scored_on"]
            assert on["defense"] == "dcs2_one" and on["rule"]["sensitive"] == "count"
    assert "scored_on" not in _score_settings(config, "dcs2_one", "2")  # its capture says
    # Table I has no DCS²: the whole batch, and its score jobs' settings as before
    assert "scored_on" not in _score_settings(config, "none", "1", model="cnn3")


def test_two_rules_in_a_table_or_two_scorings_of_a_cell_are_refused():
    config = copy.deepcopy(PARAMS)
    config["defenses"]["dcs2_half"] = {
        **config["defenses"]["dcs2_one"],
        "sensitive": "fraction",
        "fraction": 1.0,
    }
    config["tables"]["dcs2_table1"]["defenses"].append("dcs2_half")
    with pytest.raises(ConfigError, match=r"tables.dcs2_table1: its defenses dcs2_one, "):
        _score_settings(validate(config), "none", "2")
    config = copy.deepcopy(PARAMS)
    config["tables"]["table1"].update(model="lenet", batch_size=2)
    with pytest.raises(ConfigError, match=r"tables table1 and dcs2_table1 both read the runs "):
        _score_settings(validate(config), "none", "2")


def test_an_undefended_victim_in_a_table_with_dcs2_is_scored_on_its_sensitive_image(tmp_path):
    """The same image on both sides of a pair: the undefended batch's first image alone (DCS²'s
    sensitive one), matched to its best reconstruction, and the floor on it too."""
    config = validate(copy.deepcopy(PARAMS))
    settings = _score_settings(config, "none", "2")
    images = torch.rand(2, 1, 8, 8)
    victim = tmp_path / "victim0.pt"
    save_tensors(
        victim,
        {
            "images": images,
            "labels": torch.tensor([3, 4]),
            "mean": (0.5,),
            "std": (0.5,),
            "data_sha256": "0" * 64,
        },
    )
    # the second reconstruction recovers the first image; the first is the second image's
    rec = {
        "status": "ok",
        "failure": None,
        "seconds": 1.0,
        "images": torch.stack([images[1], images[0] * 0.99]),
        "labels": torch.tensor([3, 4]),
        "summary": {},
    }
    floor = torch.full((1, 8, 8), 0.5)
    row, _, _ = score_run(
        settings,
        (tmp_path / "a.pt", 0, rec),
        victim,
        {"client": {}},
        ["psnr"],
        MetricSettings(),
        "lenet",
        0,
        0,
        floor,
    )
    assert row["scored_samples"] == [0] and row["scored_on"] == "dcs2_one"
    assert row["matching"] == [1] and row["psnr"] > 35
    expected = -10 * torch.log10(((images[0] - 0.5) ** 2).mean())
    assert row["floor"]["psnr"] == pytest.approx(float(expected), rel=1e-4)


def test_a_rule_reads_dcs2s_defaults_and_only_the_setting_its_kind_uses():
    fields = {f.name: f.default for f in dataclasses.fields(DCS2.Settings)}
    assert {k: fields[k] for k in DEFAULTS} == {**DEFAULTS, "labels": ()}
    assert rule_of({}) == {"sensitive": "fraction", "fraction": 0.5}
    assert rule_of({"sensitive": "count", "fraction": 0.25}) == {"sensitive": "count", "count": 1}
    assert rule_of({"sensitive": "labels", "labels": (6,)}) == {
        "sensitive": "labels",
        "labels": [6],
    }


def test_a_fraction_a_count_rule_never_reads_is_no_conflict():
    config = copy.deepcopy(PARAMS)
    config["defenses"]["dcs2_quarter"] = {**config["defenses"]["dcs2_plus_one"], "fraction": 0.25}
    config["tables"]["dcs2_table1"]["defenses"].append("dcs2_quarter")
    on = _score_settings(validate(config), "none", "2")["scored_on"]
    assert on["rule"] == {"sensitive": "count", "count": 1}


def test_a_conflict_stops_snakemake_when_the_workflow_is_built():
    """Before any job: pipeline.validated, which the Snakefile calls first, checks it."""
    from snakemake.exceptions import WorkflowError

    from gradinv.pipeline import validated

    config = copy.deepcopy(PARAMS)
    config["tables"]["table1"].update(model="lenet", batch_size=2)
    with pytest.raises(WorkflowError, match=r"tables table1 and dcs2_table1 both read"):
        validated(config)


def test_a_table_scored_on_the_whole_batch_scores_dcs2s_runs_whole_too():
    """DCS²'s Table 3 measures "all data" of the batch: with ``scored: batch`` no score job of
    the table reads a sensitive rule, and DCS²'s own runs ignore the capture's sensitive list."""
    config = validate(copy.deepcopy(PARAMS))
    assert config["tables"]["dcs2_table3"]["scored"] == "batch"
    for defense in ("none", "noise_1e3", "noise_1e2"):  # batches of 4
        assert "scored_on" not in _score_settings(config, defense, "4")
    assert _score_settings(config, "dcs2_plus_noise", "4")["scored_on"] == "batch"
    # the same table scored on the sensitive samples: DCS²'s rule, its runs by their capture
    config = copy.deepcopy(PARAMS)
    del config["tables"]["dcs2_table3"]["scored"]
    config = validate(config)
    assert _score_settings(config, "none", "4")["scored_on"]["defense"] == "dcs2_plus_noise"
    assert "scored_on" not in _score_settings(config, "dcs2_plus_noise", "4")


def test_a_dcs2_run_two_tables_score_differently_is_refused():
    config = copy.deepcopy(PARAMS)
    config["tables"]["dcs2_table1"]["scored"] = "batch"
    config["tables"]["dcs2_table4"]["defenses"] = ["dcs2_plus_one"]  # scored on its sensitive
    with pytest.raises(ConfigError, match=r"both read the runs of patches/lenet/dcs2_plus_one/"):
        _score_settings(validate(config), "none", "2")


def test_a_dcs2_run_scored_on_the_whole_batch_matches_every_image(tmp_path):
    images = torch.rand(2, 1, 8, 8)
    victim = tmp_path / "victim0.pt"
    batch = {"labels": torch.tensor([3, 4]), "mean": (0.5,), "std": (0.5,), "data_sha256": "0" * 64}
    save_tensors(victim, {"images": images, **batch})
    # the shared batch held a concealed sample too: three reconstructions for two images
    rec = {
        "status": "ok",
        "failure": None,
        "seconds": 1.0,
        "images": torch.stack([torch.rand(1, 8, 8), images[1], images[0] * 0.99]),
        "labels": torch.tensor([3, 3, 4]),
        "summary": {},
    }
    capture = {"client": {"sensitive": [0]}}  # DCS² concealed the first image
    args = (victim, capture, ["psnr"], MetricSettings(), "lenet", 0, 0, None)
    config = validate(copy.deepcopy(PARAMS))
    settings = _score_settings(config, "dcs2_plus_noise", "4")
    row, _, _ = score_run(settings, (tmp_path / "a.pt", 0, rec), *args)
    assert row["scored_samples"] == [0, 1] and row["scored_on"] == "batch"
    assert row["matching"] == [2, 1] and row["psnr"] > 35
    settings.pop("scored_on")  # scored as DCS²'s Table 1: its sensitive image only
    row, _, _ = score_run(settings, (tmp_path / "a.pt", 0, rec), *args)
    assert row["scored_samples"] == [0] and row["matching"] == [2]
