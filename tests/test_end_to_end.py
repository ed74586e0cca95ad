"""The whole pipeline for real, on the tiny overlay (tests/configs/tiny.yaml): CENSOR's Table I
and a table of the data-centric defenses against an honest and a malicious server, built by one
Snakemake run that the tests below read (the jobs the two tables share run once)."""

import csv
import json
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest

from gradinv.io import load_tensors
from gradinv.tables.files import read_records
from test_workflow import snakemake, workflow_copy

TINY = "tests/configs/tiny.yaml"


def victim0(folder):
    """Victim 0's capture in a run's folder: the first victim of a capture job's file, with the
    server message the file holds once for its victims."""
    (path,) = folder.glob("victims0-*.pt")
    data = load_tensors(path)
    return data["runs"][0] | {"server": data["server"]}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = workflow_copy(tmp_path_factory.mktemp("tiny"))
    targets = ("results/table1.csv", "results/data_centric.csv")
    proc = snakemake(*targets, "--cores", "2", "--configfile", TINY, cwd=root, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


@pytest.mark.slow
def test_tiny_end_to_end_run(tiny_run):
    """The whole pipeline on a tiny overlay: table shape, sanity, one MLflow run per job."""
    root = tiny_run
    rows = list(csv.DictReader((root / "results/table1.csv").open()))
    labels = ["No Defense", "Noise", "Clipping", "Sparsi", "Soteria", "Censor"]
    assert [r["defense"] for r in rows] == [*labels, "Censor (never raw)"]
    for r in rows:
        assert r["dataset"] == "Patches"
        for attack in ("IG", "GI", "GIFD"):
            assert int(r[f"{attack} PSNR↓ n"]) == 1 and int(r[f"{attack} PSNR↓ failed"]) == 0
            assert 0 < float(r[f"{attack} PSNR↓ mean"]) < 60
        assert 0 <= float(r["IG MSE↑ mean"]) <= 1
        # CENSOR's victims whose update was the raw gradient (Algorithm 1), per cell
        raw = r["IG raw gradient shared"]
        assert raw in ("0 of 1", "1 of 1") if r["defense"] == "Censor" else raw in ("", "0 of 1")
    assert (
        next(r for r in rows if r["defense"] == "Censor (never raw)")["GI raw gradient shared"]
        == "0 of 1"
    )
    md = (root / "results/table1.md").read_text()
    assert "SCALED-DOWN" in md and "This run: 1 victims" in md
    assert "LPIPS UNAVAILABLE" in md  # no backbone weights on this machine: loud, never faked
    for name in ("table1_vs_paper.csv", "figures/table1.png", "figures/table1_grid.png"):
        assert (root / "results" / name).stat().st_size > 0
    captures = root / "results/captures/patches/cnn3"
    shared = victim0(captures / "none/r0_b1")
    # What the server sees, and apart what only the client knows (read by the score stage alone).
    assert set(shared) == {"server", "update", "client"}
    client = {"update_cosine", "fallback_fired", "raw_gradient_shared", "sensitive", "defense"}
    assert set(shared["client"]) == client | {"client_seconds"}  # and the client's time
    censored = victim0(captures / "censor/r0_b1")["client"]
    assert censored["raw_gradient_shared"] in (True, False)
    assert censored["raw_gradient_shared"] == censored["fallback_fired"]  # Algorithm 1
    assert shared["client"]["raw_gradient_shared"] is None  # not CENSOR: never recorded
    assert shared["update"]["meta"]["labels"] is None
    # Every result records the threat model as it ran and how fast the attack was.
    metrics = read_records(root / "results/metrics/patches/cnn3/censor/r0_b1/gi/v1.json")[0]
    assert metrics["threat_model"]["labels_from"] == "inferred: idlg"
    assert metrics["threat_model"]["eot"] == "off"
    assert metrics["restarts_layout"] == "batched"  # GI's 2 restarts on the small CNN (auto)
    assert metrics["attack_iterations_per_second"] > 0
    assert metrics["threat_model"]["server"] == "honest-but-curious"
    # Refiner's evaluation network, trained here on the public split, scores every run
    assert 0 <= metrics["noise_ratio"] <= 1 and metrics["noise_ratio_status"] == "ok"
    with sqlite3.connect(root / "mlflow.db") as db:
        runs = db.execute(
            "select t.value, count(*) from runs r join tags t on r.run_uuid = t.run_uuid "
            "where t.key = 'gradinv.kind' and r.lifecycle_stage = 'active' group by t.value"
        ).fetchall()
    # Table I: 7 defenses x 1 victim x IG, GI and GIFD; the data-centric table adds Refiner and
    # DCS²+ (trained, and attacked by IG and Imprint) and Imprint against No Defense, and the
    # utility runs of its three defenses at tiny.yaml's two seeds; GIFD's DCGAN and the
    # evaluation network, both trained on the public split
    assert dict(runs) == {
        "train": 7 + 2 + 3 * 2,
        "attack": 21 + 2 * 2 + 1,
        "train_generator": 1,
        "train_evalnet": 1,
    }
    generator = load_tensors(root / "data/generators/dcgan/patches.pt")
    assert generator["public_images"] > 0 and generator["provenance"]["partition_sha256"]
    # A second run has nothing to do: finished jobs are not recomputed.
    again = snakemake(
        "results/table1.csv",
        "results/data_centric.csv",
        "--cores",
        "2",
        "--configfile",
        TINY,
        cwd=root,
    )
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_tiny_data_centric_defenses_and_a_malicious_server_in_a_table(tiny_run):
    """Refiner and DCS²+ selected in a table beside no defense, against IG and Imprint (a
    malicious server: its own capture, on the model it changed), with the evaluation network's
    noise ratio and the utility study's accuracy and PMM as columns."""
    root = tiny_run
    table = pd.read_csv(root / "results/data_centric.csv").set_index("defense")
    assert list(table.index) == ["No Defense", "Refiner", "DCS²+"]
    assert (table["IG PSNR↓ failed"] == 0).all() and (table["Imprint PSNR↓ failed"] == 0).all()
    # Imprint reads an undefended image exactly out of its block
    assert table.loc["No Defense", "Imprint PSNR↓ mean"] > 60
    assert table["IG NoiseRatio↑ mean"].between(0, 1).all()
    assert table.loc["No Defense", "IG PMM↑ mean"] == 1.0
    assert (table["IG PMM↑ n"] == 2).all() and table["IG Accuracy↑ mean"].between(0, 100).all()
    run = "results/{}/patches/cnn3/{}/r0_b1"
    imprinted = victim0(root / run.format("captures", "none") / "imprint")
    assert imprinted["server"]["model"]["modification"]["kind"] == "imprint"
    honest = victim0(root / run.format("captures", "none"))
    assert honest["server"]["model"]["modification"] is None
    metrics = read_records(root / run.format("metrics", "none") / "imprint/v1.json")[0]
    assert metrics["threat_model"]["server"].startswith("malicious: imprint")
    # DCS²: the lone image is sensitive, one concealed sample joins it; only it is scored
    dcs = victim0(root / run.format("captures", "dcs2_plus"))
    assert dcs["update"]["meta"]["batch_size"] == 2 and dcs["client"]["sensitive"] == [0]
    scored = read_records(root / run.format("metrics", "dcs2_plus") / "ig/v1.json")[0]
    assert scored["scored_samples"] == [0] and len(scored["matching"]) == 1
    refined = victim0(root / run.format("captures", "refiner"))
    assert refined["client"]["defense"]["gradient_distance"] > 0
    assert refined["client"]["update_cosine"] < 1.0
    md = (root / "results/data_centric.md").read_text()
    assert "PMM" in md and "from each defense's FL training run" in md


@pytest.mark.slow
def test_the_papers_claims_are_checked_on_the_tiny_tables(tiny_run):
    """workflow/claims.yaml against the cells of the two tables this run built; claims on the
    tables it did not build are reported as not evaluated, with the reason."""
    root = tiny_run
    settings = json.dumps({"scale": "embedded", "tables": ["table1", "data_centric"]})
    proc = subprocess.run(
        [sys.executable, "-m", "gradinv.cli", "claims", "--settings", settings],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    claims = pd.read_csv(root / "results/claims.csv").set_index("id")
    on_built = claims["table"].isin(["table1", "data_centric"])
    groups = claims[[f"{v}_groups" for v in ("holds", "fails", "inconclusive", "undecidable")]]
    assert (claims.loc[on_built, "verdict"] != "not evaluated").all()
    assert (groups[on_built].sum(axis=1) > 0).all()
    assert (claims.loc[~on_built, "verdict"] == "not evaluated").all()
    ssim = claims.loc["censor-ssim-below-no-defense"]
    assert groups.loc["censor-ssim-below-no-defense"].sum() == 3  # Patches x IG, GI, GIFD
    # one victim a cell: no paired interval can decide, or the attack does not beat the floor
    assert ssim["verdict"] in ("inconclusive", "undecidable")
    assert "patches/ig: " in ssim["evidence"]
    assert "SCALED-DOWN" in (root / "results/claims.md").read_text()


SWEEPS_OVERLAY = """
tables:
  cvb_table5: {model: [cnn3, vit], attacks: [ig_ignore], victims: 1}
  frontier_runs: {sweeps: [noise_std], attacks: [ig, ig_eot], victims: 1,
                  metrics: [psnr, ssim, pmm], tradeoff: pmm}
sweeps:
  noise_std: {values: [0.001, 0.01]}  # 0.01 is noise's own std: that point reads noise's runs
client_time: {models: [lenet, vit], defenses: [sparsi, refiner_warm], batch_size: 4, repeats: 2}
"""


@pytest.mark.slow
def test_sweeps_several_models_the_frontier_and_client_time_end_to_end(tmp_path):
    """Issue 9's new kinds of target in one Snakemake run: a sweep's variants (names with a
    dot) trained, attacked and given their own utility runs, the one at its base's value read
    from the base's runs; a table over two models; the
    frontier from the strongest attack per metric; Refiner's Table 4 from timed client updates."""
    root = workflow_copy(tmp_path)
    (root / "tests/configs/sweeps.yaml").write_text(SWEEPS_OVERLAY)
    targets = ("results/frontier.png", "results/cvb_table5.csv", "results/refiner_table4_time.csv")
    overlays = ("--configfile", TINY, "tests/configs/sweeps.yaml")
    proc = snakemake(*targets, "--cores", "2", *overlays, cwd=root, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]

    frontier = pd.read_csv(root / "results/frontier.csv").set_index("defense")
    assert list(frontier.index) == ["none", "noise-std0.001", "noise-std0.01"]
    assert list(frontier["value"].iloc[1:]) == [0.001, 0.01]
    # the point at the base's value ran once, as the base, and is shown under its own name
    assert (root / "results/utility/common/patches/cnn3/noise/seed0/summary.json").is_file()
    assert not list((root / "results").rglob("noise-std0.01"))
    assert frontier.loc["noise-std0.01", ["psnr", "pmm"]].notna().all()  # from noise's files
    assert set(frontier["psnr_attack"]) <= {"IG", "IG+EOT"}
    assert frontier["pmm"].notna().all() and frontier.loc["none", "pmm"] == 1.0
    assert (root / "results/frontier.png").stat().st_size > 0
    # the table behind it drawn as Refiner's figures are: PMM against each metric, per sweep
    assert (root / "results/figures/frontier_runs.png").stat().st_size > 0

    cells = pd.read_csv(root / "results/cvb_table5_cells.csv")
    assert set(cells["model"]) == {"cnn3", "vit"}
    asr = cells[cells["metric"] == "attack_success"]["mean"]
    assert asr.between(0, 1).all() and len(asr) == 6  # 2 models x 3 defenses, IG (Ignore)
    accuracy = cells[cells["metric"] == "accuracy"]
    assert accuracy["mean"].notna().all()  # each model's own utility runs
    assert len(pd.read_csv(root / "results/cvb_table5.csv")) == 6

    times = pd.read_csv(root / "results/refiner_table4_time.csv").set_index("defense")
    assert list(times.index) == ["sparsi", "refiner_warm"]
    assert (times[["lenet", "vit"]] > 0).all().all()
    # Refiner's warm start: later calls reuse the robust data, the first call has none
    warm = json.loads((root / "results/client_time/patches/lenet/refiner_warm.json").read_text())
    assert len(warm["timed_seconds"]) == 2 and warm["first_call_seconds"] > 0
    assert "(0.1418)" in (root / "results/refiner_table4_time.md").read_text()  # the paper's
    vs = pd.read_csv(root / "results/refiner_table4_time_vs_paper.csv")
    assert len(vs) == 4 and vs["paper"].notna().all()  # the paper reports LeNet and ViT
