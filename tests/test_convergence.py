"""CENSOR's convergence study (Figs. 7-8, Table VI) is rendered from training summaries.

The summaries below are synthetic fixtures for the report code, not results; the real runs are
exercised by the workflow tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from gradinv.stages.convergence import run

CONV = {
    "title": "CENSOR (NDSS 2025) Figures 7-8 and Table VI: convergence",
    "dataset": "patches",
    "model": "cnn3",
    "defenses": ["none", "censor"],
    "partition": {"scheme": "dirichlet", "num_clients": 6, "alpha": 0.5, "labels_per_client": 2},
    "fl": {"rounds": 20},
    "clients_per_round": [2, 4],
    "clients_defenses": ["none", "censor"],
    "reference": str(
        Path(__file__).resolve().parents[1] / "workflow/reference/censor_table6_clients.csv"
    ),
    "scaled_down_note": "Twenty rounds on six clients.",
}
LABELS = {"none": "No Defense", "censor": "Censor"}


def summary(tmp: Path, defense: str, k: int, final: float, status: str = "ok") -> Path:
    history = [
        {"round": r, "test_accuracy": final * r / 20, "test_loss": 2.0 - r / 20}
        for r in (0, 10, 20)
    ]
    path = tmp / defense / f"k{k}" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "status": status,
                "failure": None if status == "ok" else "loss diverged at round 3",
                "history": history if status == "ok" else history[:1],
                "defense": defense,
                "defense_stats": {"updates": 40, "fallbacks": 0} if defense == "censor" else None,
                "git_commit": "abc",
            }
        )
    )
    return path


def settings(scale: str = "embedded") -> dict:
    return {"convergence": CONV, "labels": LABELS, "scale": scale, "seed": 0, "fl": {"rounds": 20}}


def test_figures_curves_and_the_clients_table(tmp_path):
    runs = {
        (d, k): summary(tmp_path, d, k, acc)
        for (d, k, acc) in [
            ("none", 2, 0.6),
            ("censor", 2, 0.55),
            ("none", 4, 0.7),
            ("censor", 4, 0.66),
        ]
    }
    out = tmp_path / "results"
    run(settings(), [runs[("none", 2)], runs[("censor", 2)]], list(runs.values()), out)
    curves = pd.read_csv(out / "convergence.csv")
    assert len(curves) == 6 and set(curves["label"]) == {"No Defense", "Censor"}
    table = pd.read_csv(out / "table6_clients.csv")
    assert list(table["selected_clients"]) == [2, 4]
    assert table["No Defense accuracy"].tolist() == pytest.approx([60.0, 70.0])
    assert table["Censor - No Defense"].tolist() == pytest.approx([-5.0, -4.0])
    for name in ("fig7_accuracy.png", "fig8_loss.png"):
        assert Image.open(out / name).size[0] > 0
    md = (out / "table6_clients.md").read_text()
    assert "SCALED-DOWN" in md and "Twenty rounds on six clients." in md
    # Embedded runs are not compared with the paper's CIFAR-10 numbers.
    assert (out / "table6_clients_vs_paper.csv").read_text().count("\n") == 1


def test_a_failed_run_keeps_its_row_and_reason(tmp_path):
    a = summary(tmp_path, "none", 2, 0.6)
    b = summary(tmp_path, "censor", 2, 0.5, status="failed")
    out = tmp_path / "results"
    conv = {**CONV, "clients_per_round": [2]}
    run({**settings(), "convergence": conv}, [a, b], [a, b], out)
    table = pd.read_csv(out / "table6_clients.csv")
    assert pd.isna(table.loc[0, "Censor accuracy"])
    assert table.loc[0, "Censor failure"] == "loss diverged at round 3"


def test_paper_scale_is_compared_with_table_vi(tmp_path):
    runs = [summary(tmp_path, d, k, 0.85) for k in (10, 30) for d in ("none", "censor")]
    out = tmp_path / "results"
    conv = {**CONV, "clients_per_round": [10, 30]}
    run({**settings("paper"), "convergence": conv}, runs[:2], runs, out)
    comp = pd.read_csv(out / "table6_clients_vs_paper.csv")
    assert comp["paper"].tolist() == [85.27, 85.33]
    assert comp["difference"].tolist() == pytest.approx([85.0 - 85.27, 85.0 - 85.33])
