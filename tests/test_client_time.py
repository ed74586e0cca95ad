"""Refiner's Table 4 report: our seconds beside the paper's, for models that stand in for the paper's."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gradinv.config import REPO_ROOT, load, validate
from gradinv.io import write_json
from gradinv.jobs import job_settings
from gradinv.stages.client_time import report


def timings(tmp_path: Path, settings: dict, seconds: dict[tuple[str, str], float]) -> list[Path]:
    files = []
    for (model, defense), value in seconds.items():
        path = tmp_path / f"{model}_{defense}.json"
        write_json(
            path,
            {
                "model": model,
                "defense": defense,
                "defense_label": settings["labels"][defense],
                "batch_size": 32,
                "seconds": value,
                "device": "cpu",
                "git_commit": "abc",
            },
        )
        files.append(path)
    return files


@pytest.fixture
def settings() -> dict:
    config = validate(load(REPO_ROOT / "params.yaml"))
    config["client_time"] |= {"models": ["lenet", "resnet18_gn"], "defenses": ["sparsi", "refiner"]}
    return json.loads(job_settings(config, "client_time_report"))


def test_a_stand_in_model_is_compared_with_the_papers_column(tmp_path, settings):
    ours = {("lenet", "sparsi"): 0.01, ("lenet", "refiner"): 0.5}
    ours |= {("resnet18_gn", "sparsi"): 0.02, ("resnet18_gn", "refiner"): 4.0}
    report(settings, timings(tmp_path, settings, ours), tmp_path)

    vs = pd.read_csv(tmp_path / "refiner_table4_time_vs_paper.csv").set_index(["defense", "model"])
    reference = pd.read_csv(REPO_ROOT / "workflow/reference/refiner_table4_time.csv")
    published = reference.set_index(["model", "defense"])["value"]
    refiner_label = settings["labels"]["refiner"]
    sparsi_label = settings["labels"]["sparsi"]
    row = vs.loc[("refiner", "resnet18_gn")]
    assert row["paper_model"] == "resnet18"
    assert row["paper"] == pytest.approx(published[("resnet18", refiner_label)])
    assert row["ours_ratio"] == pytest.approx(200.0)
    paper_ratio = published[("resnet18", refiner_label)] / published[("resnet18", sparsi_label)]
    assert row["paper_ratio"] == pytest.approx(paper_ratio)
    assert vs.loc[("sparsi", "lenet"), "ours_ratio"] == pytest.approx(1.0)
    text = (tmp_path / "refiner_table4_time.md").read_text()
    assert f"({published[('resnet18', refiner_label)]:g})" in text
    assert "resnet18_gn against the paper's resnet18" in text


def test_a_model_the_paper_does_not_report_has_no_published_seconds(tmp_path, settings):
    settings["client_time"]["paper_models"] = {}
    ours = {("lenet", "sparsi"): 0.01, ("lenet", "refiner"): 0.5}
    ours |= {("resnet18_gn", "sparsi"): 0.02, ("resnet18_gn", "refiner"): 4.0}
    report(settings, timings(tmp_path, settings, ours), tmp_path)

    vs = pd.read_csv(tmp_path / "refiner_table4_time_vs_paper.csv").set_index(["defense", "model"])
    assert vs.loc[("refiner", "resnet18_gn"), ["paper", "paper_ratio"]].isna().all()
    assert not pd.isna(vs.loc[("refiner", "lenet"), "paper"])
