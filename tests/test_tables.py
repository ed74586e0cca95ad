"""Tables are rendered from metrics files alone: check cells, failures, comparison, bytes, images.

The metrics dicts below are synthetic test fixtures, not results.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from gradinv.io import write_json
from gradinv.tables import (
    GridEntry,
    MetricsFileError,
    TableError,
    collect,
    long_table,
    paper_table,
    read_reference,
    reconstruction_grid,
    render_table,
    vs_paper,
)
from gradinv.tables.markdown import format_cell

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "workflow" / "reference" / "censor_table1.csv"
LABELS = {
    "none": "No Defense",
    "noise": "Noise",
    "censor": "CENSOR",
    "ig": "IG",
    "gi": "GI",
    "gifd": "GIFD",
}
SETTING = {
    "datasets": ["patches"],
    "image size": "16x16",
    "model": "resnet18",
    "iterations": 20,
    "restarts": 1,
    "victims": 3,
    "scale": "embedded",
}
NOTE = "Stand-in 16x16 patches, 20 iterations: sized to run on two CPU cores in minutes."


def run(defense: str = "none", attack: str = "ig", victim: int = 0, **over) -> dict:
    """One synthetic metrics record (a fixture for the table code, not a result)."""
    rec = {
        "dataset": "patches",
        "dataset_label": "Patches",
        "paper_dataset": None,
        "model": "resnet18",
        "defense": defense,
        "defense_label": LABELS[defense],
        "defense_kind": defense,
        "attack": attack,
        "attack_label": LABELS[attack],
        "attack_kind": attack,
        "round": 0,
        "batch_size": 1,
        "victim": victim,
        "status": "ok",
        "failure": None,
        "mse": 0.01 * (victim + 1),
        "psnr": 20.0 + victim,
        "ssim": 0.5,
        "lpips": 0.3,
        "lpips_status": "ok",
        "label_accuracy": 1.0,
        "scale": "embedded",
        "seed": 0,
        "git_commit": "abc123",
        "config_hash": "cfg",
        "data_sha256": "d",
    }
    rec.update(over)
    return rec


def write(tmp_path: Path, records: list[dict]) -> list[Path]:
    folder = tmp_path / "metrics"
    folder.mkdir(exist_ok=True)
    paths = []
    for rec in records:
        name = f"{rec['dataset']}_{rec['defense']}_{rec['attack']}_r{rec['round']}_{rec['victim']}"
        path = folder / f"{name}.json"
        write_json(path, rec)  # as the score stage writes it: with its digest
        paths.append(path)
    return paths


def render_records(tmp_path: Path, records: list[dict], out: Path, **options) -> dict[str, Path]:
    """``render_table`` of ``records`` as table1: their attacks, defenses and datasets in the
    order they hold them, the test setting, note and CENSOR's Table I reference; ``options``
    replace any of these."""
    keys = {
        key: list(dict.fromkeys(r[key] for r in records))
        for key in ("attack", "defense", "dataset")
    }
    return render_table(
        "table1",
        write(tmp_path, records),
        out,
        **{
            "attacks": keys["attack"],
            "defenses": keys["defense"],
            "datasets": keys["dataset"],
            "setting": SETTING,
            "scaled_down_note": NOTE,
            "reference_csv": REFERENCE,
            **options,
        },
    )


def grid_records() -> list[dict]:
    return [run(d, a, v) for d in ("noise", "none") for a in ("gi", "ig") for v in range(3)]


def test_rows_and_columns_follow_the_given_order(tmp_path):
    df = collect(write(tmp_path, grid_records()))
    wide = paper_table(df, attacks=["ig", "gi"], defenses=["none", "noise"])
    assert list(wide["defense"]) == ["No Defense", "Noise"]
    assert list(wide["dataset"]) == ["Patches", "Patches"]
    cells = [
        f"{a} {m} {s}"
        for a in ("IG", "GI")
        for m in ("MSE↑", "LPIPS↑", "PSNR↓", "SSIM↓")
        for s in ("mean", "std", "ci_low", "ci_high", "n", "failed", "note")
    ]
    assert list(wide.columns) == ["dataset", "defense", *cells]


def test_mean_std_n_match_hand_computation(tmp_path):
    df = collect(write(tmp_path, grid_records()))
    wide = paper_table(df, attacks=["ig", "gi"], defenses=["none", "noise"]).iloc[0]
    mses = [0.01, 0.02, 0.03]
    assert wide["IG MSE↑ mean"] == pytest.approx(sum(mses) / 3)
    assert wide["IG MSE↑ std"] == pytest.approx(float(np.std(mses, ddof=1)))
    assert wide["IG PSNR↓ mean"] == pytest.approx(21.0)
    assert wide["IG MSE↑ n"] == 3 and wide["IG MSE↑ failed"] == 0
    assert wide["IG MSE↑ note"] == ""
    # the 95% interval: a percentile bootstrap over the 3 victims, inside their range
    assert 0.01 <= wide["IG MSE↑ ci_low"] < sum(mses) / 3 < wide["IG MSE↑ ci_high"] <= 0.03


def test_a_cells_interval_is_a_seeded_percentile_bootstrap_of_its_victims(tmp_path):
    from scipy import stats

    from gradinv.stats import RESAMPLES, seed_of

    psnr = [12.0, 15.5, 21.0, 17.25, 30.0, 9.5]
    records = [run(victim=v, psnr=p) for v, p in enumerate(psnr)]
    long = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none"])
    cell = long[long["metric"] == "psnr"].iloc[0]
    expected = stats.bootstrap(
        (psnr,),
        np.mean,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(seed_of("patches", "none", "ig", "psnr")),
    ).confidence_interval
    assert (cell["ci_low"], cell["ci_high"]) == pytest.approx((expected.low, expected.high))
    again = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none"])
    assert again.equals(long)  # seeded by the cell, not by the order of work
    one = long_table(collect(write(tmp_path, records[:1])), attacks=["ig"], defenses=["none"])
    assert one[["ci_low", "ci_high"]].isna().all().all()  # one victim: no interval


def test_failed_runs_are_counted_never_averaged(tmp_path):
    records = [
        run(victim=0),
        run(victim=1),
        run(
            victim=2,
            status="failed",
            failure="non-finite attack loss at iteration 120",
            mse=math.nan,
            psnr=math.inf,
            ssim=None,
            lpips=None,
        ),
        run(victim=3, psnr=math.nan),
    ]  # "ok" but non-finite: failed for PSNR only
    df = collect(write(tmp_path, records))
    cell = paper_table(df, attacks=["ig"], defenses=["none"]).iloc[0]
    assert cell["IG MSE↑ mean"] == pytest.approx((0.01 + 0.02 + 0.04) / 3)
    assert (cell["IG MSE↑ n"], cell["IG MSE↑ failed"]) == (3, 1)
    assert "non-finite attack loss at iteration 120" in cell["IG MSE↑ note"]
    assert cell["IG PSNR↓ mean"] == pytest.approx(20.5)
    assert (cell["IG PSNR↓ n"], cell["IG PSNR↓ failed"]) == (2, 2)
    assert "non-finite PSNR" in cell["IG PSNR↓ note"]


def test_an_exact_reconstruction_counts_as_the_best_psnr_not_a_failure(tmp_path):
    """MSE 0 gives PSNR +inf (Imprint without a defense): the attack's best result, averaged in
    (the mean PSNR is then +inf), shown as ∞, never counted as a failure or dropped."""
    records = [run(victim=0, mse=0.0, psnr=math.inf), run(victim=1, psnr=30.0)]
    long = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none"])
    cell = long[long["metric"] == "psnr"].iloc[0]
    assert cell["mean"] == math.inf and (cell["n"], cell["failed"]) == (2, 0)
    assert math.isnan(cell["std"]) and "1 exact reconstruction(s)" in cell["note"]
    # the interval: resamples without the exact victim have the other's 30 dB as their mean
    assert format_cell(cell.to_dict()) == "∞ [30.000, ∞] (2, 1 exact)"
    mse = long[long["metric"] == "mse"].iloc[0]
    assert (mse["n"], mse["failed"]) == (2, 0)


def test_a_run_with_nothing_to_score_is_neither_ok_nor_failed(tmp_path):
    """DCS² with sensitive labels protects nothing in a batch without them: that victim is
    counted apart, with the reason, neither averaged in nor counted as a failure."""
    reason = "the batch holds no sensitive sample: the defense protected none of it"
    records = [run(victim=0), run(victim=1, status="not_scored", failure=reason, mse=None)]
    cell = paper_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none"])
    cell = cell.iloc[0]
    assert (cell["IG MSE↑ n"], cell["IG MSE↑ failed"]) == (1, 0)
    assert cell["IG MSE↑ mean"] == pytest.approx(0.01)
    assert "1 not scored: " + reason in cell["IG MSE↑ note"]


def test_accuracy_and_pmm_come_from_the_training_runs(tmp_path):
    """Metrics of scope training: one value per defense in every attack's column, whatever the
    attacks did; a failed training run is a failure with its reason."""
    records = [run(d, a, v) for d in ("none", "noise") for a in ("ig", "gi") for v in range(2)]
    records[0] |= {"status": "failed", "failure": "non-finite attack loss"}
    why = "training failed: non-finite training loss at round 3"
    training = {  # one value per seed that finished
        "pmm": {
            ("patches", "resnet18", "none"): ({0: 1.0, 1: 1.0, 2: 1.0}, ""),
            ("patches", "resnet18", "noise"): ({}, why),
        },
        "accuracy": {
            ("patches", "resnet18", "none"): ({0: 48.0, 1: 50.0, 2: 52.0}, ""),
            ("patches", "resnet18", "noise"): ({}, why),
        },
    }
    render_table(
        "t",
        write(tmp_path, records),
        tmp_path,
        attacks=["ig", "gi"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        metrics=["psnr", "accuracy", "pmm"],
        training=training,
    )
    table = pd.read_csv(tmp_path / "t.csv").set_index("defense")
    assert table.loc["No Defense", "IG PMM↑ mean"] == 1.0  # its IG victim 0 failed: no matter
    accuracy = table.loc["No Defense"]
    assert accuracy["GI Accuracy↑ mean"] == 50.0 and accuracy["GI Accuracy↑ n"] == 3  # seeds
    # the interval over the seeds: mean ± t(0.975, 2) x 2 / sqrt(3)
    half = 4.302653 * 2.0 / 3**0.5
    assert accuracy["GI Accuracy↑ ci_low"] == pytest.approx(50.0 - half, rel=1e-5)
    assert table.loc["Noise", "IG PMM↑ failed"] == 1 and why in table.loc["Noise", "IG PMM↑ note"]
    md = (tmp_path / "t.md").read_text()
    assert "from each defense's FL training runs" in md and why in md
    # seed by seed, what the claims on accuracy pair
    seeds = pd.read_csv(tmp_path / "t_training.csv")
    assert list(seeds["seed"]) == [0, 1, 2] and list(seeds["accuracy"]) == [48.0, 50.0, 52.0]
    assert set(seeds["defense"]) == {"none"}  # the failed noise runs have no seed


def test_unavailable_lpips_is_empty_with_reason(tmp_path):
    reason = "unavailable: lpips weights not found offline"
    records = [run(victim=v, lpips=None, lpips_status=reason) for v in range(2)]
    paths = write(tmp_path, records)
    cell = paper_table(collect(paths), attacks=["ig"], defenses=["none"]).iloc[0]
    assert math.isnan(cell["IG LPIPS↑ mean"]) and cell["IG LPIPS↑ n"] == 0
    assert cell["IG LPIPS↑ failed"] == 0 and reason in cell["IG LPIPS↑ note"]
    out = render_table(
        "t",
        paths,
        tmp_path / "out",
        attacks=["ig"],
        defenses=["none"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=REFERENCE,
    )
    text = out["markdown"].read_text(encoding="utf-8")
    assert "LPIPS UNAVAILABLE in every cell" in text and reason in text
    assert "| Patches | No Defense | 0.0150 ± 0.0071 [0.0100, 0.0200] (2) | n/a |" in text


def test_missing_combination_is_shown_not_dropped(tmp_path):
    df = collect(write(tmp_path, [run("none", "ig", 0)]))
    wide = paper_table(df, attacks=["ig"], defenses=["none", "noise"])
    assert list(wide["defense"]) == ["No Defense", "noise"]
    assert wide.iloc[1]["IG MSE↑ note"] == "no runs" and wide.iloc[1]["IG MSE↑ n"] == 0


def test_mixed_settings_in_one_cell_are_an_error(tmp_path):
    df = collect(write(tmp_path, [run(victim=0), run(victim=1, round=5)]))
    with pytest.raises(TableError, match="round"):
        paper_table(df, attacks=["ig"], defenses=["none"])


def test_vs_paper_matches_the_papers_dataset(tmp_path):
    records = [
        run(
            victim=v,
            dataset="cifar10",
            dataset_label="CIFAR-10",
            paper_dataset="CIFAR-10",
            psnr=25.0 + v,
        )
        for v in range(2)
    ]
    long = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none"])
    comp = vs_paper(long, REFERENCE)
    assert len(comp) == 4  # MSE, LPIPS, PSNR, SSIM
    psnr = comp[comp["metric"] == "PSNR"].iloc[0]
    assert (psnr["dataset"], psnr["defense"], psnr["attack"]) == ("CIFAR-10", "No Defense", "IG")
    assert psnr["paper"] == pytest.approx(26.324)
    assert psnr["ours_mean"] == pytest.approx(25.5) and psnr["ours_n"] == 2
    assert psnr["difference"] == pytest.approx(25.5 - 26.324)
    assert psnr["scale"] == "embedded"
    # our interval over the two victims is [25, 26]: the published 26.324 lies outside it
    assert (psnr["ours_ci_low"], psnr["ours_ci_high"]) == (25.0, 26.0)
    assert bool(psnr["paper_in_interval"]) is False
    shifted = [r | {"psnr": r["psnr"] + 1.0} for r in records]  # [26, 27] holds 26.324
    long = long_table(collect(write(tmp_path, shifted)), attacks=["ig"], defenses=["none"])
    psnr = vs_paper(long, REFERENCE).query("metric == 'PSNR'").iloc[0]
    assert bool(psnr["paper_in_interval"]) is True


def test_no_paper_dataset_gives_header_only(tmp_path):
    out = render_table(
        "table1",
        write(tmp_path, grid_records()),
        tmp_path / "out",
        attacks=["ig", "gi"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=REFERENCE,
        reproduces="CENSOR's Table I",
    )
    assert out["vs_paper"].read_text(encoding="utf-8") == (
        "dataset,defense,attack,metric,ours_mean,ours_std,ours_ci_low,ours_ci_high,ours_n,"
        "ours_failed,paper,difference,paper_in_interval,scale\n"
    )
    text = out["markdown"].read_text(encoding="utf-8")
    assert "No dataset of this run is one of the paper's datasets" in text
    assert "SCALED-DOWN run of CENSOR's Table I" in text and NOTE in text
    assert "↑ higher is better for the defender" in text
    assert "- **iterations**: 20" in text and "abc123" in text


def test_rerender_is_byte_identical_and_pngs_are_images(tmp_path):
    records = grid_records()
    records[1] = run(
        records[1]["defense"],
        records[1]["attack"],
        records[1]["victim"],
        status="failed",
        failure="diverged",
        mse=math.nan,
    )
    paths = write(tmp_path, records)
    kwargs = dict(
        attacks=["ig", "gi"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=REFERENCE,
    )
    first = render_table("table1", paths, tmp_path / "a", **kwargs)
    second = render_table("table1", list(reversed(paths)), tmp_path / "b", **kwargs)
    for key, path in first.items():
        assert path.read_bytes() == second[key].read_bytes(), key
    assert "diverged" in first["markdown"].read_text(encoding="utf-8")
    with Image.open(first["figure"]) as img:
        img.verify()
        assert img.format == "PNG"
    with Image.open(first["figure"]) as img:  # a scaled-down figure says so, under it and here
        assert img.text["Title"] == (
            "table1. SCALED-DOWN run (embedded scale), not the paper's setting: see table1.md."
        )
    assert not list((tmp_path / "a").rglob("*.tmp"))


def test_reconstruction_grid_writes_a_png(tmp_path):
    torch.manual_seed(0)
    originals = {v: torch.rand(3, 8, 8) for v in range(2)}
    entries = [
        {
            "dataset": "patches",
            "defense_label": d,
            "attack_label": "IG",
            "victim": v,
            "original": originals[v],
            "reconstruction": torch.rand(3, 8, 8),
        }
        for d in ("No Defense", "Censor")
        for v in range(2)
    ]
    entries[-1]["reconstruction"] = torch.full((3, 8, 8), math.nan)
    out = tmp_path / "figures" / "grid.png"
    reconstruction_grid(entries, out, "Fig. 6. Scale: paper.")
    with Image.open(out) as img:
        assert img.text["Title"] == "Fig. 6. Scale: paper."
    entries[0]["original"] = torch.zeros(3, 8, 8)
    with pytest.raises(TableError, match="two different originals"):
        reconstruction_grid(entries, out, "")


def test_a_failed_attack_is_a_labelled_tile_in_the_grid(tmp_path, monkeypatch):
    """A victim whose attack failed has no reconstruction (None, from the scoring stage's
    pair): its tile says so, and the table's figure is drawn, not refused."""
    from gradinv.stages.common import first_scored_pair
    from gradinv.tables import grid

    secret = {"images": torch.rand(1, 3, 8, 8)}
    original, failed = first_scored_pair(
        {"status": "failed"}, {"status": "failed", "failure": "non-finite loss"}, secret
    )
    assert failed is None
    drawn = []

    def draw(ax, image):
        drawn.append(image if isinstance(image, str) else type(image).__name__)
        return real_draw(ax, image)

    real_draw = grid._draw
    monkeypatch.setattr(grid, "_draw", draw)
    entries = [
        GridEntry("patches", "No Defense", "DLG", 0, original, torch.rand(3, 8, 8)),
        GridEntry("patches", "Censor", "DLG", 0, original, failed),
    ]
    out = tmp_path / "grid.png"
    reconstruction_grid(entries, out, "Fig. 6. Scale: embedded.")
    assert out.exists()
    assert drawn == ["ndarray", "ndarray", "ndarray", "failed"]  # originals, then the cells


def test_a_reconstruction_not_on_disk_is_a_labelled_tile_and_counted(tmp_path, monkeypatch, capsys):
    """The grid only illustrates (the table's numbers come from the scores): a reconstruction
    file that was deleted or not carried to this machine is a tile that says so, the caption
    and the log count it and name the command that makes it again, and the grid is drawn."""
    from gradinv.io import save_tensors
    from gradinv.stages import report
    from gradinv.tables import grid

    victim = tmp_path / "victim0.pt"
    save_tensors(victim, {"images": torch.rand(1, 3, 8, 8)})
    kept = tmp_path / "attacks" / "none" / "victims0-0.pt"
    save_tensors(kept, {"runs": [{"status": "ok", "images": torch.rand(1, 3, 8, 8)}]})
    rows = [
        {
            "dataset_label": "Patches",
            "defense": defense,
            "defense_label": defense,
            "attack": "ig",
            "attack_label": "IG",
            "model": "lenet",
            "round": 0,
            "victim": 0,
            "status": "ok",
            "victim_file": str(victim),
            "reconstruction": str(tmp_path / "attacks" / defense / "victims0-0.pt"),
            "reconstruction_index": 0,
        }
        for defense in ("none", "censor")
    ]
    monkeypatch.setattr(report, "scored_runs", lambda files: rows)
    drawn = []
    real_draw = grid._draw
    monkeypatch.setattr(
        grid,
        "_draw",
        lambda ax, image: (drawn.append(image), real_draw(ax, image))[1],
    )
    out = tmp_path / "grid.png"
    report._grid([], out, [0], caption="Grid.", shown={}, shown_attacks={})
    assert [d for d in drawn if isinstance(d, str)] == [grid.NOT_KEPT]
    missing = tmp_path / "attacks" / "censor" / "victims0-0.pt"
    note = f"1 of the 2 reconstructions are not on disk (their attacks' files, such as {missing}"
    with Image.open(out) as img:
        assert img.text["Title"].startswith(f"Grid. {note}")
    assert note in capsys.readouterr().err


def test_a_table_with_two_batch_sizes_draws_each_in_rows_of_its_own(tmp_path, monkeypatch):
    """DCS²'s Table 1 attacks Imprint on batches of 4 and IG on batches of 2. Batches of distinct
    labels share no image, so victim 14's batch of 4 starts one image later than its batch of 2:
    two originals for one victim, which stopped the report ("two different originals for
    ('Patches', 14)"). Each batch size now has rows of its own, with its own originals."""
    from gradinv.io import save_tensors
    from gradinv.stages import report

    rows = []
    for bs, attack in ((2, "ig"), (4, "imprint")):
        victim = tmp_path / f"b{bs}" / "victim14.pt"
        save_tensors(victim, {"images": torch.rand(bs, 3, 8, 8)})  # a different first image
        attacked = tmp_path / "attacks" / attack / "victims8-15.pt"
        images = torch.rand(bs, 3, 8, 8)
        save_tensors(attacked, {"runs": [{"status": "ok", "images": images}] * 8})
        rows.append(
            {
                "dataset_label": "Patches",
                "defense": "none",
                "defense_label": "No Defense",
                "attack": attack,
                "attack_label": attack,
                "model": "lenet",
                "round": 0,
                "batch_size": bs,
                "victim": 14,
                "status": "ok",
                "victim_file": str(victim),
                "reconstruction": str(attacked),
                "reconstruction_index": 6,
            }
        )
    monkeypatch.setattr(report, "scored_runs", lambda files: rows)
    drawn = []
    monkeypatch.setattr(
        report,
        "reconstruction_grid",
        lambda entries, out, caption: (
            drawn.extend(entries),
            reconstruction_grid(entries, out, caption),
        )[1],
    )
    out = tmp_path / "grid.png"
    report._grid([], out, [0], caption="Grid.", shown={}, shown_attacks={})
    assert [(e.dataset, e.attack_label) for e in drawn] == [
        ("Patches, batch 2", "ig"),
        ("Patches, batch 4", "imprint"),
    ]
    assert out.stat().st_size > 0
    with pytest.raises(TableError, match="two different originals"):  # as one row, refused
        reconstruction_grid(
            [replace(e, dataset="Patches") for e in drawn], tmp_path / "one.png", ""
        )


def test_malformed_files_are_named(tmp_path):
    good = write(tmp_path, [run()])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(MetricsFileError, match=r"broken\.json"):
        collect([*good, broken])
    incomplete = tmp_path / "incomplete.json"
    write_json(incomplete, {k: v for k, v in run().items() if k != "status"})
    with pytest.raises(MetricsFileError, match=r"incomplete\.json: missing key\(s\) status"):
        collect([incomplete])
    twice = tmp_path / "twice.json"
    write_json(twice, run())
    with pytest.raises(MetricsFileError, match="same job"):
        collect([*good, twice])


def test_embedded_run_without_note_is_refused(tmp_path):
    with pytest.raises(TableError, match="scaled_down_note"):
        render_table(
            "t",
            write(tmp_path, [run()]),
            tmp_path / "o",
            attacks=["ig"],
            defenses=["none"],
            datasets=["patches"],
            setting=SETTING,
            scaled_down_note="",
            reference_csv=None,
        )


def test_reference_copy_is_complete():
    ref = read_reference(REFERENCE)
    assert len(ref) == 3 * 6 * 5 * 4
    assert set(ref["defense"]) == {"No Defense", "Noise", "Clipping", "Sparsi", "Soteria", "Censor"}
    assert pd.api.types.is_float_dtype(ref["value"])


def test_vs_paper_matches_an_extra_key_column(tmp_path):
    """CENSOR's Table V is keyed by round too: each of our rounds meets the paper's round."""
    records = [
        run(
            victim=v,
            round=r,
            dataset="imagenet",
            dataset_label="ImageNet",
            paper_dataset="ImageNet",
            defense="none",
            psnr=10.0 + r,
        )
        for r in (0, 1)
        for v in range(2)
    ]
    long = long_table(
        collect(write(tmp_path, records)),
        rows=("dataset", "defense", "round"),
        attacks=["ig"],
        defenses=["none"],
    )
    ref = tmp_path / "ref.csv"
    ref.write_text(
        "dataset,defense,attack,round,metric,value\n"
        "ImageNet,No Defense,IG,0,PSNR,13.0\nImageNet,No Defense,IG,1,PSNR,11.0\n"
    )
    comp = vs_paper(long, ref)
    assert list(comp["round"]) == ["0", "1"]
    assert list(comp["ours_mean"]) == [10.0, 11.0]
    assert list(comp["difference"]) == [-3.0, 0.0]
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("dataset,defense,attack,epoch,metric,value\nImageNet,No Defense,IG,0,PSNR,1\n")
    with pytest.raises(TableError, match="epoch"):
        vs_paper(long, wrong)


@pytest.fixture
def drawn(monkeypatch):
    """Every line the figures draw, as (label, xs, ys)."""
    import matplotlib.axes

    lines = []
    real = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        lines.append((kwargs.get("label"), list(args[0]), list(args[1])))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    return lines


def test_a_swept_table_draws_a_line_per_attack(tmp_path, drawn):
    from gradinv.tables.render import Sweep

    records = [run(victim=v, round=r, psnr=20.0 - r) for r in (0, 3, 6) for v in range(2)]
    out = render_table(
        "table5_rounds",
        write(tmp_path, records),
        tmp_path / "out",
        attacks=["ig"],
        defenses=["none"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        rows=("dataset", "defense", "round"),
        sweep=Sweep("round", {0: 0.0, 3: 3.0, 6: 6.0}, "FL round"),
    )
    table = pd.read_csv(out["csv"])
    assert list(table["round"]) == [0, 3, 6]
    assert list(table["IG PSNR↓ mean"]) == [20.0, 17.0, 14.0]
    # PSNR's panel: one line, IG's, through the rounds (other panels plot the other metrics)
    psnr = [(x, y) for label, x, y in drawn if y == [20.0, 17.0, 14.0]]
    assert psnr == [([0.0, 3.0, 6.0], [20.0, 17.0, 14.0])]
    assert {label for label, _, _ in drawn} == {"Patches / No Defense / IG"}
    assert Image.open(out["figure"]).size[0] > 0


def test_a_tradeoff_figure_puts_each_defense_at_its_pmm_along_its_sweep(tmp_path, monkeypatch):
    """Refiner's Figs. 6, 9, 10: PMM on x, the attack's metric on y, a line per sweep."""
    from gradinv.tables.figures import tradeoff_points
    from gradinv.tables.render import Tradeoff

    monkeypatch.setitem(LABELS, "noise-std0.01", "Noise std=0.01")
    monkeypatch.setitem(LABELS, "noise-std0.1", "Noise std=0.1")
    defenses = ["none", "noise-std0.01", "noise-std0.1"]
    psnr = {"none": 30.0, "noise-std0.01": 20.0, "noise-std0.1": 12.0}
    pmm = {"none": 1.0, "noise-std0.01": 0.9, "noise-std0.1": 0.6}
    records = [run(d, "ig", v, psnr=psnr[d]) for d in defenses for v in range(2)]
    training = {"pmm": {("patches", "resnet18", d): ({0: pmm[d]}, "") for d in defenses}}
    lines = {"none": ("No Defense", 0), "noise-std0.01": ("Noise", 1), "noise-std0.1": ("Noise", 2)}
    out = render_table(
        "fig6",
        write(tmp_path, records),
        tmp_path,
        attacks=["ig"],
        defenses=defenses,
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        metrics=["psnr", "pmm"],
        training=training,
        tradeoff=Tradeoff("pmm", lines),
    )
    assert Image.open(out["figure"]).size[0] > 0
    long = pd.read_csv(out["cells"])
    points = tradeoff_points(long, x_metric="pmm", lines=lines)
    assert set(points["metric"]) == {"psnr"}
    noise = points[points["line"] == "Noise"]
    assert list(noise["x"]) == [0.9, 0.6] and list(noise["y"]) == [20.0, 12.0]
    assert points.loc[points["line"] == "No Defense", ["x", "y"]].values.tolist() == [[1.0, 30.0]]


def test_a_tradeoff_point_carries_both_intervals_as_error_bars():
    """Each point of a utility-privacy figure has the PMM's interval over seeds on x and the
    cell's interval over victims on y; a missing or infinite bound draws no bar that way."""
    from gradinv.tables.figures import _error_bars, tradeoff_points

    def cell(defense, metric, mean, low, high):
        return {
            "dataset": "patches",
            "dataset_label": "Patches",
            "defense": defense,
            "attack_label": "IG",
            "metric": metric,
            "mean": mean,
            "ci_low": low,
            "ci_high": high,
        }

    long = pd.DataFrame.from_records(
        [
            cell("none", "pmm", 1.0, math.nan, math.nan),  # one seed: no interval
            cell("none", "psnr", 30.0, 28.0, math.inf),  # an exact reconstruction among them
            cell("noise", "pmm", 0.8, 0.7, 0.85),
            cell("noise", "psnr", 20.0, 18.5, 21.0),
        ]
    )
    lines = {"none": ("No Defense", 0), "noise": ("Noise", 1)}
    points = tradeoff_points(long, x_metric="pmm", lines=lines).set_index("defense")
    assert points.loc["noise", ["x", "x_low", "x_high"]].tolist() == [0.8, 0.7, 0.85]
    assert points.loc["noise", ["y", "y_low", "y_high"]].tolist() == [20.0, 18.5, 21.0]
    x_bars, y_bars = _error_bars(points, "x"), _error_bars(points, "y")
    np.testing.assert_allclose(x_bars, [[0.0, 0.1], [0.0, 0.05]])  # (below, above) x points
    np.testing.assert_allclose(y_bars, [[0.0, 1.5], [0.0, 1.0]])
    assert _error_bars(points.drop(columns=["y_low"]), "y") is None


def test_a_table_without_published_numbers_says_why(tmp_path):
    out = render_table(
        "fig",
        write(tmp_path, [run(victim=v) for v in range(2)]),
        tmp_path,
        attacks=["ig"],
        defenses=["none"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        no_reference="the paper's figure prints no numbers",
    )
    assert "No published numbers: the paper's figure prints no numbers." in (
        out["markdown"].read_text()
    )


def test_the_tradeoff_lines_follow_each_sweeps_order_and_keep_sweeps_apart():
    """A line per sweep in the table's order of defenses (the sweep's values), not the sorted
    run keys (bits16 before bits2); two sweeps of one base are two lines; a defense outside any
    sweep is a point of its own."""
    from gradinv.stages.report import _tradeoff

    order = ["none", "q-bits2", "q-bits16", "r-beta1", "r-beta10", "r-tau0.5", "r"]
    points = {
        "q-bits2": ["q", "bits", 2],
        "q-bits16": ["q", "bits", 16],
        "r-beta1": ["r", "beta", 1],
        "r-beta10": ["r", "beta", 10],
        "r-tau0.5": ["r", "tau", 0.5],
    }
    settings = {
        "labels": {"defenses": {"none": "No Defense", "q": "GQ", "r": "Refiner"}},
        "sweep_points": points,
        "table": {"defenses": order},
        "defenses": {d: {} for d in sorted(order)},  # job settings arrive with sorted keys
    }
    lines = _tradeoff("pmm", settings).lines
    assert lines["q-bits2"] == ("GQ sweep", 1) and lines["q-bits16"] == ("GQ sweep", 2)
    assert lines["r-beta1"][0] == lines["r-beta10"][0] == "Refiner (beta sweep)"
    assert lines["r-tau0.5"][0] == "Refiner (tau sweep)"
    assert lines["r"] == ("Refiner", 6) and lines["none"] == ("No Defense", 0)


def test_a_sweep_point_read_from_its_bases_runs_is_a_row_of_its_own(tmp_path, monkeypatch):
    """Refiner's Tables 5-8: the default row (β=1) is the base's run, shown under its label."""
    monkeypatch.setitem(LABELS, "noise-std0.1", "Noise std=0.1")
    records = [
        run(d, "ig", v, psnr=p + v)
        for d, p in (("noise", 20.0), ("noise-std0.1", 12.0))
        for v in range(2)
    ]
    pmm = {
        ("patches", "resnet18", "noise"): ({0: 0.9}, ""),
        ("patches", "resnet18", "noise-std0.1"): ({0: 0.6}, ""),
    }
    out = render_table(
        "sweep",
        write(tmp_path, records),
        tmp_path,
        attacks=["ig"],
        defenses=["noise-std0.01", "noise-std0.1"],  # the base is no row: read for std 0.01
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        metrics=["psnr", "pmm"],
        training={"pmm": pmm},
        shared={"noise-std0.01": ("noise", "Noise std=0.01")},
    )
    cells = pd.read_csv(out["cells"]).set_index(["defense", "metric"])
    assert list(dict.fromkeys(cells.index.get_level_values("defense"))) == [
        "noise-std0.01",
        "noise-std0.1",
    ]
    assert cells.loc[("noise-std0.01", "psnr"), "mean"] == 20.5
    assert cells.loc[("noise-std0.01", "psnr"), "defense_label"] == "Noise std=0.01"
    assert cells.loc[("noise-std0.01", "pmm"), "mean"] == 0.9  # the base's training run
    assert cells.loc[("noise-std0.1", "psnr"), "mean"] == 12.5
    text = out["markdown"].read_text(encoding="utf-8")
    assert "runs outside this table" not in text  # the base's files are this table's


def test_an_adaptive_attack_read_from_the_plain_attacks_runs_is_a_column_of_its_own(
    tmp_path, monkeypatch
):
    """IG+EOT against a deterministic defense is IG: the table shows IG's runs under it."""
    monkeypatch.setitem(LABELS, "ig_eot", "IG+EOT")
    records = [
        run(d, "ig", v, psnr=p + v) for d, p in (("none", 20.0), ("noise", 12.0)) for v in range(2)
    ]
    records += [run("noise", "ig_eot", v, psnr=15.0 + v) for v in range(2)]
    out = render_table(
        "adaptive",
        write(tmp_path, records),
        tmp_path,
        attacks=["ig", "ig_eot"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        metrics=["psnr"],
        shared_attacks={"none": {"ig_eot": ("ig", "IG+EOT")}},
    )
    cells = pd.read_csv(out["cells"]).set_index(["defense", "attack"])
    assert cells.loc[("none", "ig_eot"), "mean"] == cells.loc[("none", "ig"), "mean"] == 20.5
    assert cells.loc[("none", "ig_eot"), "attack_label"] == "IG+EOT"
    assert cells.loc[("noise", "ig_eot"), "mean"] == 15.5  # an attack that adapts runs its own
    assert "**runs scored**: 6" in out["markdown"].read_text(encoding="utf-8")


def test_a_figure_shows_the_first_scored_image_beside_the_reconstruction_matched_to_it():
    """A batch of 3 of which DCS² protected samples 1 and 2, the matching having put
    reconstruction 1 against sample 1: the grid pairs them, not the batch's first images."""
    import torch

    from gradinv.stages.common import first_scored_pair

    secret = {"images": torch.arange(3.0).view(3, 1, 1, 1)}
    rec = {"status": "ok", "images": torch.arange(10.0, 12.0).view(2, 1, 1, 1)}
    row = {"status": "ok", "scored_samples": [1, 2], "matching": [1, 0]}
    original, reconstruction = first_scored_pair(row, rec, secret)
    assert original.item() == 1.0 and reconstruction.item() == 11.0
    failed = first_scored_pair({**row, "status": "failed"}, {"status": "failed"}, secret)
    assert failed[0].item() == 1.0 and failed[1] is None


def test_each_cell_counts_the_victims_whose_update_was_the_raw_gradient(tmp_path):
    """CENSOR under Algorithm 1 shares G0 when no candidate helps: every cell says how many of
    its victims' updates were raw (the CSV, the cells and the Markdown); a defense that records
    nothing shows nothing."""
    records = [
        *(run("none", a, v, raw_gradient_shared=None) for a in ("ig", "gi") for v in range(3)),
        *(run("noise", a, v, raw_gradient_shared=v == 1) for a in ("ig", "gi") for v in range(3)),
    ]
    records[-1] |= {"status": "failed", "failure": "boom", "psnr": math.nan}  # still captured
    long = long_table(
        collect(write(tmp_path, records)), attacks=["ig", "gi"], defenses=["none", "noise"]
    )
    noise = long[long["defense"] == "noise"]
    assert (noise["raw_shared"] == 1).all() and (noise["raw_recorded"] == 3).all()
    assert long.loc[long["defense"] == "none", "raw_recorded"].eq(0).all()
    out = render_table(
        "t",
        write(tmp_path, records),
        tmp_path / "out",
        attacks=["ig", "gi"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
    )
    wide = pd.read_csv(out["csv"], keep_default_na=False).set_index("defense")
    assert wide.loc["Noise", "IG raw gradient shared"] == "1 of 3"
    assert wide.loc["No Defense", "GI raw gradient shared"] == ""
    md = Path(out["markdown"]).read_text()
    assert "raw gradient shared" in md and "| 1 of 3 |" in md and "| — |" in md


def test_a_table_without_raw_gradient_records_has_no_such_column(tmp_path):
    wide = paper_table(collect(write(tmp_path, grid_records())), attacks=["ig"], defenses=["none"])
    assert not [c for c in wide.columns if "raw gradient" in c]


def test_a_swept_table_draws_a_line_per_family_of_the_swept_setting(tmp_path, monkeypatch, drawn):
    """Fig. 9 under both fallbacks: T on x, one line per fallback, named by what differs."""
    from gradinv.stages.report import _sweep

    for key, label in {"a1": "A T1", "a5": "A T5", "n1": "N T1", "n5": "N T5"}.items():
        monkeypatch.setitem(LABELS, key, label)
    defenses = {
        d: {"kind": "censor", "label": LABELS[d], "trials": t, "fallback": f}
        for d, t, f in (
            ("a1", 1, "algorithm-1"),
            ("a5", 5, "algorithm-1"),
            ("n1", 1, "never-raw"),
            ("n5", 5, "never-raw"),
        )
    }
    sweep = _sweep("trials", defenses, [0])
    assert sweep.series == {
        "a1": "fallback=algorithm-1",
        "a5": "fallback=algorithm-1",
        "n1": "fallback=never-raw",
        "n5": "fallback=never-raw",
    }
    psnr = {"a1": 20.0, "a5": 18.0, "n1": 15.0, "n5": 12.0}
    records = [run(d, victim=v, psnr=p) for d, p in psnr.items() for v in range(2)]
    render_table(
        "fig9",
        write(tmp_path, records),
        tmp_path / "out",
        attacks=["ig"],
        defenses=list(defenses),
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
        sweep=sweep,
    )
    lines = {(label, tuple(x), tuple(y)) for label, x, y in drawn if set(y) <= set(psnr.values())}
    assert lines == {
        ("Patches / IG / fallback=algorithm-1", (1.0, 5.0), (20.0, 18.0)),
        ("Patches / IG / fallback=never-raw", (1.0, 5.0), (15.0, 12.0)),
    }
    assert _sweep("trials", {d: defenses[d] for d in ("a1", "a5")}, [0]).series is None


def test_each_victim_keeps_its_floor_and_each_undefended_attack_says_if_it_beats_it(tmp_path):
    """The floor (the public split's mean image) is scored against every victim: the victims
    file keeps both values side by side, and the Markdown says, per undefended attack and
    metric, whether the attack beats it on the median victim."""
    floor = {"mse": 0.05, "psnr": 13.0, "ssim": 0.1}
    records = [
        *(run("none", "ig", v, psnr=20.0 + v, floor=floor) for v in range(3)),  # beats it
        *(run("none", "gi", v, psnr=12.0 - v, floor=floor) for v in range(3)),  # does not
        *(run("noise", "ig", v, psnr=11.0, floor=floor) for v in range(3)),
    ]
    out = render_table(
        "t",
        write(tmp_path, records),
        tmp_path / "out",
        attacks=["ig", "gi"],
        defenses=["none", "noise"],
        datasets=["patches"],
        setting=SETTING,
        scaled_down_note=NOTE,
        reference_csv=None,
    )
    victims = pd.read_csv(out["victims"])
    assert len(victims) == 9 and (victims["floor_psnr"] == 13.0).all()
    ig = victims[(victims["defense"] == "none") & (victims["attack"] == "ig")]
    assert list(ig["psnr"]) == [20.0, 21.0, 22.0] and (ig["floor_mse"] == 0.05).all()
    md = Path(out["markdown"]).read_text()
    section = md.split("## Does each attack work without a defense?")[1].split("\n## ")[0]
    assert "| patches | resnet18 | 0 | IG | PSNR | +8.000 (3) | yes |" in section
    assert "| patches | resnet18 | 0 | GI | PSNR | -2.000 (3) | **no** |" in section
    # MSE: lower is closer, so the gain is the floor's MSE minus the attack's (0.05 - 0.02)
    assert "| patches | resnet18 | 0 | IG | MSE | +0.0300 (3) | yes |" in section


def test_every_cell_is_compared_with_the_floor_and_one_at_or_below_it_is_marked(tmp_path):
    """Not only the undefended attacks: each cell carries its median gain over the floor, and a
    cell whose median victim is no closer than the floor (here the defended one) says so."""
    floor = {"mse": 0.05, "psnr": 13.0, "ssim": 0.1}
    records = [
        *(run("none", "ig", v, psnr=20.0 + v, floor=floor) for v in range(3)),
        *(run("noise", "ig", v, psnr=12.0 + v, floor=floor) for v in range(3)),
    ]
    long = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none", "noise"])
    psnr = long[long["metric"] == "psnr"].set_index("defense")
    assert psnr.loc["none", "floor_gain"] == 8.0 and psnr.loc["noise", "floor_gain"] == 0.0
    assert (psnr["floor_n"] == 3).all()
    assert format_cell(psnr.loc["none"].to_dict()).endswith("(3)")
    assert format_cell(psnr.loc["noise"].to_dict()).endswith("(3) ≤ floor")
    # MSE: lower is closer; 0.01 .. 0.03 against the floor's 0.05 beats it under both
    mse = long[long["metric"] == "mse"].set_index("defense")
    assert mse.loc["noise", "floor_gain"] == pytest.approx(0.03)
    assert "floor" not in format_cell(mse.loc["noise"].to_dict())


def test_runs_with_nothing_to_score_are_counted_not_shown_as_missing(tmp_path):
    """A DCS² batch without a sensitive sample is not scored: neither averaged nor failed, but a
    cell of such runs only is not "no runs", and a cell with some says how many."""
    skip = {"status": "not_scored", "failure": "no sensitive sample in the batch"}
    records = [
        *(run("none", "ig", v, **skip) for v in range(2)),
        *(run("noise", "ig", v) for v in range(2)),
        run("noise", "ig", 2, **skip),
    ]
    long = long_table(collect(write(tmp_path, records)), attacks=["ig"], defenses=["none", "noise"])
    psnr = long[long["metric"] == "psnr"].set_index("defense")
    assert format_cell(psnr.loc["none"].to_dict()) == "— (0, 2 not scored)"
    assert format_cell(psnr.loc["noise"].to_dict()).endswith("(2, 1 not scored)")


def test_a_table_without_an_undefended_row_reads_another_tables_to_say_if_its_attack_works(
    tmp_path,
):
    """CENSOR's round and EOT tables show GIFD only under CENSOR: whether GIFD works at all comes
    from another table's undefended run of it, marked as such; without one the Markdown says
    it is not measured."""
    floor = {"mse": 0.05, "psnr": 13.0, "ssim": 0.1}
    defended = [run("censor", "gifd", v, psnr=9.0, floor=floor) for v in range(3)]
    undefended = [run("none", "gifd", v, psnr=12.0 - v, floor=floor) for v in range(3)]
    other = tmp_path / "other"
    other.mkdir()

    def render(extra):
        return render_table(
            "t",
            write(tmp_path, defended),
            tmp_path / "out",
            attacks=["gifd"],
            defenses=["censor"],
            datasets=["patches"],
            setting=SETTING,
            scaled_down_note=NOTE,
            reference_csv=None,
            undefended_files=extra,
        )

    md = Path(render(write(other, undefended))["markdown"]).read_text()
    section = md.split("## Does each attack work without a defense?")[1].split("\n## ")[0]
    assert "| patches | resnet18 | 0 | GIFD † | PSNR | -2.000 (3) | **no** |" in section
    assert "read from another table's undefended run of it" in section
    alone = Path(render([])["markdown"]).read_text()
    assert "whether its attacks work at all is not measured here" in alone
