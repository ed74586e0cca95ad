"""CENSOR's convergence study (Figs. 7-8, Table VI): the official code's training loop, and the
report rendered from training summaries.

The summaries below are synthetic fixtures for the report code, not results; the real runs are
exercised by the workflow tests.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

from gradinv.defenses import build_defense
from gradinv.fl.official import OfficialLoop, train_official
from gradinv.io import write_json
from gradinv.models import build_model
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec
from gradinv.stages.convergence import run
from interrupt import Interrupted, StopAfter

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
    write_json(  # as the train stage writes it: with its digest
        path,
        {
            "status": status,
            "failure": None if status == "ok" else "loss diverged at round 3",
            "history": history if status == "ok" else history[:1],
            "defense": defense,
            "defense_stats": {"updates": 40, "fallbacks": 0} if defense == "censor" else None,
            "git_commit": "abc",
        },
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
        with Image.open(out / name) as img:
            assert (
                "SCALED-DOWN run" in img.text["Title"] and "table6_clients.md" in img.text["Title"]
            )
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


def official_summary(tmp: Path, defense: str, final: float) -> Path:
    history = [
        {"round": r, "test_accuracy": final * r / 4, "test_loss": 2.0 - r / 4} for r in range(5)
    ]
    path = tmp / defense / "official" / "summary.json"
    path.parent.mkdir(parents=True)
    record = {"status": "ok", "failure": None, "history": history, "defense": defense}
    write_json(path, {**record, "defense_stats": None, "git_commit": "abc"})
    return path


def test_the_official_loop_is_a_second_panel_and_table(tmp_path):
    a, b = summary(tmp_path, "none", 2, 0.6), summary(tmp_path, "censor", 2, 0.1)
    loop = [official_summary(tmp_path, "none", 0.5), official_summary(tmp_path, "censor", 0.48)]
    out = tmp_path / "results"
    conv = {**CONV, "clients_per_round": [2], "official_loop": {"epochs": 4, "defended_epochs": 2}}
    run({**settings(), "convergence": conv}, [a, b], [a, b], out, official=loop)
    curves = pd.read_csv(out / "convergence.csv")
    assert curves.groupby("loop").size().to_dict() == {
        "FL, CENSOR's Algorithm 1": 6,
        "official code's loop (central training)": 10,
    }
    md = (out / "table6_clients.md").read_text()
    assert "| Censor | 48.00 | 4 | -2.00 |" in md
    assert "first 2 of 4 epochs" in md
    wide = Image.open(out / "fig7_accuracy.png").size[0]
    run({**settings(), "convergence": conv}, [a, b], [a, b], out)  # without: one panel
    assert Image.open(out / "fig7_accuracy.png").size[0] < wide
    assert "official code's loop" not in (out / "table6_clients.md").read_text()


LOOP = OfficialLoop(
    epochs=4,
    defended_epochs=2,
    defended_batch=1,
    step_lr=1e-3,
    batch_size=16,
    lr=0.05,
    defended_lr=1e-3,
    momentum=0.9,
    weight_decay=5e-4,
    eval_every=1,
    eval_samples=16,
)


def _official(defense, progress=None):
    spec = ModelSpec("cnn3", num_classes=4, in_channels=3, image_size=16, settings={})
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(48, 3, 16, 16, generator=g), torch.randint(0, 4, (48,), generator=g)
    model = build_model(spec, seed=0)
    final = {}

    def keep(rnd, m):
        final[rnd] = {k: v.clone() for k, v in m.state_dict().items()}

    history = train_official(model, x, y, x[:16], y[:16], defense, LOOP, 3, keep, progress)
    return final, history


def test_official_loop_defends_only_its_first_epochs_and_resumes_bit_for_bit(tmp_path):
    censor = build_defense("censor", {"trials": 3}, where="test", update_lr=1e-3)
    final, history = _official(censor)
    assert [h["defended"] for h in history[1:]] == [1.0, 1.0, 0.0, 0.0]
    assert censor.stats["updates"] == LOOP.defended_epochs  # one defended step per epoch
    assert list(final) == [LOOP.epochs] and all("test_accuracy" in h for h in history)
    # The central epochs train on raw gradients: the loss falls although the defense is on.
    assert history[-1]["train_loss"] < history[1]["train_loss"]
    with pytest.raises(Interrupted):
        _official(
            build_defense("censor", {"trials": 3}, where="test", update_lr=1e-3),
            StopAfter(tmp_path / "p", saves=2),
        )
    resumed = Progress(tmp_path / "p", fingerprint="f", every=0)
    again = build_defense("censor", {"trials": 3}, where="test", update_lr=1e-3)
    final2, history2 = _official(again, resumed)
    assert history2 == history
    assert all(torch.equal(final2[4][k], final[4][k]) for k in final[4])
