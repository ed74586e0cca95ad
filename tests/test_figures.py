"""Figures fit for a paper: no text box overlaps another at any table size, an unavailable metric
is a short note in its panel, axes say what they measure and which way is better, and a grid
puts defenses in rows and attacks in columns. A table's HTML page holds its table, its figure
and the paper's numbers beside ours.

Every figure of the pipeline goes through ``save_figure``, which checks for overlapping text;
``GRADINV_FIGURE_CHECK=strict`` (set here and by the tiny end-to-end run) makes it an error.
The metrics below are synthetic test fixtures, not results.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from gradinv.tables import TableError
from gradinv.tables.aggregate import metric_axis_label
from gradinv.tables.figures import curve_figure, draw_tradeoff, save_figure, text_overlaps
from gradinv.tables.grid import reconstruction_grid
from test_tables import render_records, run

DEFENSES = ["none", "noise", "clipping", "sparsification", "soteria", "censor", "censor_raw"]
ATTACKS = ["ig", "gi", "ggl", "gias", "gifd"]
LABELS = {
    "none": "No Defense",
    "noise": "Noise",
    "clipping": "Clipping",
    "sparsification": "Sparsi",
    "soteria": "Soteria",
    "censor": "Censor",
    "censor_raw": "Censor (never raw)",
    **{a: a.upper() for a in ATTACKS},
}
LPIPS_MISSING = (
    "LPIPS unavailable: backbone weights vgg16-397923af.pth not found at /root/.cache/torch/hub/"
    "checkpoints/vgg16-397923af.pth (the torch hub cache). Put torchvision's vgg16-397923af.pth "
    "(from https://download.pytorch.org/models/vgg16-397923af.pth) there."
)


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("GRADINV_FIGURE_CHECK", "strict")


# a sweep of every defense at several strengths (the frontier's table): 40 bars a panel per attack
SWEEP = [f"{d}_{k}" for d in DEFENSES[1:] for k in range(6)][:39]
LABELS |= {s: f"{LABELS[s.rsplit('_', 1)[0]]} strength={s[-1]}" for s in SWEEP}


def records(defenses, attacks, victims, *, lpips=True, failed=0):
    """Per-victim records; the first ``failed`` victims of each cell failed (no metrics)."""
    rng = np.random.default_rng(0)
    failure = {"status": "failed", "failure": "non-finite loss", "psnr": None, "mse": None,
               "ssim": None, "lpips": None}  # fmt: skip
    return [
        {
            **run("none", "ig", v),
            "defense": d,
            "defense_label": LABELS[d],
            "defense_kind": d,
            "attack": a,
            "attack_label": LABELS[a],
            "attack_kind": a,
            "psnr": float(rng.uniform(8, 30)),
            "mse": float(rng.uniform(0, 0.3)),
            "ssim": float(rng.uniform(0, 0.8)),
            **(
                {}
                if lpips
                else {"lpips": None, "lpips_status": "unavailable", "lpips_error": LPIPS_MISSING}
            ),
            **(failure if v < failed else {}),
        }
        for d, a, v in itertools.product(defenses, attacks, range(victims))
    ]


@pytest.mark.parametrize(
    ("defenses", "attacks", "victims", "failed"),
    [
        (DEFENSES[:1], ATTACKS[:1], 1, 0),
        (DEFENSES[:2], ATTACKS[:2], 3, 0),
        (DEFENSES, ATTACKS, 4, 0),
        (DEFENSES, ATTACKS, 4, 1),  # a "1 failed" note under every bar
        (["none", *SWEEP], ATTACKS[:4], 3, 1),
    ],
    ids=["one-cell", "small", "table-i", "table-i-a-failure-a-cell", "forty-defenses"],
)
def test_a_table_figure_has_no_overlapping_text_at_any_size(
    tmp_path, defenses, attacks, victims, failed
):
    rows = records(defenses, attacks, victims, lpips=False, failed=failed)
    paths = render_records(tmp_path, rows, tmp_path / "out")  # strict: an overlap would raise
    with Image.open(paths["figure"]) as img:
        assert img.format == "PNG" and img.width > 300


def test_the_overlap_check_finds_overlapping_text(tmp_path):
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.text(0.5, 0.5, "a long label here", transform=ax.transAxes)
    ax.text(0.52, 0.5, "another long label", transform=ax.transAxes)
    assert text_overlaps(fig) == [("a long label here", "another long label")]
    with pytest.raises(TableError, match="overlapping text"):
        save_figure(fig, tmp_path / "f.png", "caption")
    assert not (tmp_path / "f.png").exists()  # nothing half-right is written


def test_an_unavailable_metric_is_a_short_note_in_its_panel_not_the_error(tmp_path, monkeypatch):
    drawn = {}
    import gradinv.tables.figures as figures

    real = figures.save_figure

    def keep(fig, out, caption):
        drawn["fig"] = fig
        real(fig, out, caption)

    monkeypatch.setattr(figures, "save_figure", keep)
    render_records(tmp_path, records(DEFENSES[:2], ATTACKS[:1], 2, lpips=False), tmp_path / "out")
    texts = [t.get_text() for t in drawn["fig"].findobj(lambda a: hasattr(a, "get_text"))]
    panel = [t for t in texts if t.startswith("LPIPS unavailable")]
    assert panel and all("vgg16" not in t and len(t) < 60 for t in panel)
    # every other panel names its metric, unit and the better direction on its axis
    labels = {ax.get_ylabel() for ax in drawn["fig"].axes if ax.get_ylabel()}
    assert metric_axis_label("psnr") in labels
    assert metric_axis_label("psnr").startswith("PSNR (dB) ↓")
    assert "lower: better for the defender" in metric_axis_label("psnr")
    assert all(ax.get_xlabel() == "defense" for ax in drawn["fig"].axes)


def test_a_grid_has_a_row_per_defense_and_the_originals_then_each_attack_as_columns(
    tmp_path, monkeypatch
):
    rng = np.random.default_rng(1)
    originals = {v: rng.random((3, 32, 32)) for v in range(6)}
    entries = [
        {
            "dataset": "Patches",
            "defense_label": LABELS[d],
            "attack_label": LABELS[a],
            "victim": v,
            "original": originals[v],
            "reconstruction": rng.random((3, 32, 32)),
        }
        for d, a, v in itertools.product(DEFENSES, ATTACKS, range(6))
    ]
    entries[0]["reconstruction"] = np.full((3, 32, 32), math.nan)
    drawn = {}
    import gradinv.tables.grid as grid

    real = grid.save_figure
    monkeypatch.setattr(
        grid, "save_figure", lambda f, o, c: (drawn.setdefault("f", f), real(f, o, c))
    )
    reconstruction_grid(entries, tmp_path / "grid.png", "A caption.", victims=4)
    fig = drawn["f"]
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert titles == ["Original", *[LABELS[a] for a in ATTACKS]]  # columns
    rows = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert rows == [LABELS[d] for d in DEFENSES]  # rows
    assert len(fig.axes) == len(DEFENSES) * (1 + len(ATTACKS)) * 4  # 4 victims side by side
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert images and all(im.get_interpolation() == "nearest" for im in images)
    assert any(t.get_text() == "non-\nfinite" for ax in fig.axes for t in ax.texts)
    with Image.open(tmp_path / "grid.png") as img:  # a 32x32 image is drawn at least 2x
        assert img.width >= 2 * 32 * 4 * (1 + len(ATTACKS))


def test_a_grid_names_each_victim_under_an_empty_tile_too_and_the_check_sees_what_is_drawn(
    tmp_path, monkeypatch
):
    """CENSOR's Fig. 10 grid: one attack did not run for the last row, whose tiles are then
    blank (axis off). Each column still names its victim below, where the caption does not cover
    it; a label matplotlib keeps on an axis turned off is not drawn, and not counted as text."""
    rng = np.random.default_rng(2)
    entries = [
        {
            "dataset": "Patches",
            "defense_label": LABELS[d],
            "attack_label": LABELS[a],
            "victim": 0,
            "original": np.zeros((3, 32, 32)),
            "reconstruction": rng.random((3, 32, 32)),
        }
        for d, a in itertools.product(["none", "censor"], ["ig", "gi"])
        if (d, a) != ("censor", "gi")
    ]
    drawn = {}
    import gradinv.tables.grid as grid

    real = grid.save_figure
    monkeypatch.setattr(
        grid, "save_figure", lambda f, o, c: (drawn.setdefault("f", f), real(f, o, c))
    )
    reconstruction_grid(entries, tmp_path / "grid.png", "A caption. " * 30)  # strict: no overlap
    fig = drawn["f"]
    below = [t for ax in fig.axes for t in ax.texts if t.get_text() == "victim 0"]
    assert len(below) == 3  # Original, IG, GI: the GI tile of the last row is empty
    blank = Figure()
    ax = blank.add_subplot()
    ax.set_xlabel("victim 0")
    ax.axis("off")
    blank.text(0.5, 0.05, "victim 0, where the axis label would be")
    assert text_overlaps(blank) == []
    ax.axis("on")
    assert text_overlaps(blank) != []


def test_curves_and_tradeoffs_have_no_overlapping_text(tmp_path):
    curves = pd.DataFrame(
        [
            {"round": r, "label": label, "accuracy": 0.1 + 0.01 * r, "panel": panel}
            for r in range(20)
            for label in ("No Defense", "Censor", "Noise (sigma 0.01)")
            for panel in ("ours", "official code")
        ]
    )
    curve_figure(curves, tmp_path / "c.png", y="accuracy", y_label="test accuracy", caption="C.")
    points = pd.DataFrame(
        [
            {
                "facet": "Patches / lenet",
                "metric": m,
                "attack_label": a,
                "line": line,
                "x": x,
                "y": y,
                "note": "",
            }
            for m in ("psnr", "ssim")
            for a in ("IG", "GI")
            for line, x, y in (("Noise", 0.9, 12.0), ("Noise", 0.7, 10.0), ("Refiner", 0.95, 9.0))
        ]
    )
    draw_tradeoff(points, tmp_path / "t.png", x_label="PMM↑", caption="T.")
    for name in ("c.png", "t.png"):
        with Image.open(tmp_path / name) as img:
            assert img.format == "PNG"


def test_a_tables_page_holds_the_table_its_figure_and_the_papers_numbers(tmp_path):
    cifar = {"dataset": "cifar10", "dataset_label": "CIFAR-10", "paper_dataset": "CIFAR-10"}
    paths = render_records(
        tmp_path,
        [r | cifar for r in records(DEFENSES[:2], ATTACKS[:1], 3)],
        tmp_path / "out",
        title="CENSOR (NDSS 2025) Table I: defenses",
    )
    page = paths["html"].read_text(encoding="utf-8")
    assert "<h1>CENSOR (NDSS 2025) Table I: defenses</h1>" in page
    assert page.count("<table>") >= 2  # the table, the comparison (and the floor checks)
    assert "No Defense" in page and "SCALED-DOWN" in page
    assert "data:image/png;base64," in page  # the figure travels with the page
    assert "Ours beside the paper (censor_table1.csv)" in page
    assert "<td>26.32</td>" in page  # CIFAR-10, no defense, IG: the paper's PSNR
