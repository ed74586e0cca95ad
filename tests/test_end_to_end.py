"""The whole pipeline for real, on the tiny overlay (tests/configs/tiny.yaml): CENSOR's Table I
and a table of the data-centric defenses against an honest and a malicious server, built by one
Snakemake run that the tests below read (the jobs the two tables share run once); then, in the
same folder, the utility study and the sweeps, which reuse what that run made."""

import csv
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from browser import browser_page, screenshot
from gradinv.io import load_tensors
from gradinv.tables.files import read_records
from services import mlflow_server
from test_workflow import run_folder, snakemake, workflow_copy

TINY = "tests/configs/tiny.yaml"


def victim0(folder):
    """Victim 0's capture in a run's folder: the first victim of a capture job's file, with the
    server message the file holds once for its victims."""
    (path,) = folder.glob("victims0-*.pt")
    data = load_tensors(path)
    return data["runs"][0] | {"server": data["server"]}


TARGETS = ("results/table1.csv", "results/data_centric.csv")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = workflow_copy(tmp_path_factory.mktemp("tiny"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GRADINV_FIGURE_CHECK", "strict")  # every figure: no overlapping text
        proc = snakemake(*TARGETS, "--cores", "2", "--configfile", TINY, cwd=root, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


@pytest.mark.slow
def test_tiny_end_to_end_run(tiny_run):
    """The whole pipeline on a tiny overlay: table shape, sanity, one MLflow run per job."""
    root = tiny_run
    run = run_folder(root, TINY)
    rows = list(csv.DictReader((run / "results/table1.csv").open()))
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
    md = (run / "results/table1.md").read_text()
    assert "SCALED-DOWN" in md and "This run: 1 victims" in md
    assert "LPIPS UNAVAILABLE" in md  # no backbone weights on this machine: loud, never faked
    for name in ("table1_vs_paper.csv", "figures/table1.png", "figures/table1_grid.png"):
        assert (run / "results" / name).stat().st_size > 0
    captures = run / "results/captures/patches/cnn3"
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
    metrics = read_records(run / "results/metrics/patches/cnn3/censor/r0_b1/gi/v1.json")[0]
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
    generator = load_tensors(run / "data/generators/dcgan/patches.pt")
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
    run = run_folder(root, TINY)
    table = pd.read_csv(run / "results/data_centric.csv").set_index("defense")
    assert list(table.index) == ["No Defense", "Refiner", "DCS²+"]
    assert (table["IG PSNR↓ failed"] == 0).all() and (table["Imprint PSNR↓ failed"] == 0).all()
    # Imprint reads an undefended image exactly out of its block
    assert table.loc["No Defense", "Imprint PSNR↓ mean"] > 60
    assert table["IG NoiseRatio↑ mean"].between(0, 1).all()
    assert table.loc["No Defense", "IG PMM↑ mean"] == 1.0
    assert (table["IG PMM↑ n"] == 2).all() and table["IG Accuracy↑ mean"].between(0, 100).all()
    cell = "results/{}/patches/cnn3/{}/r0_b1"
    imprinted = victim0(run / cell.format("captures", "none") / "imprint")
    assert imprinted["server"]["model"]["modification"]["kind"] == "imprint"
    honest = victim0(run / cell.format("captures", "none"))
    assert honest["server"]["model"]["modification"] is None
    metrics = read_records(run / cell.format("metrics", "none") / "imprint/v1.json")[0]
    assert metrics["threat_model"]["server"].startswith("malicious: imprint")
    # DCS²: the lone image is sensitive, one concealed sample joins it; only it is scored
    dcs = victim0(run / cell.format("captures", "dcs2_plus"))
    assert dcs["update"]["meta"]["batch_size"] == 2 and dcs["client"]["sensitive"] == [0]
    scored = read_records(run / cell.format("metrics", "dcs2_plus") / "ig/v1.json")[0]
    assert scored["scored_samples"] == [0] and len(scored["matching"]) == 1
    refined = victim0(run / cell.format("captures", "refiner"))
    assert refined["client"]["defense"]["gradient_distance"] > 0
    assert refined["client"]["update_cosine"] < 1.0
    md = (run / "results/data_centric.md").read_text()
    assert "PMM" in md and "from each defense's FL training run" in md


@pytest.mark.slow
def test_the_papers_claims_are_checked_on_the_tiny_tables(tiny_run):
    """workflow/claims.yaml against the cells of the two tables this run built; claims on the
    tables it did not build are reported as not evaluated, with the reason."""
    root = tiny_run
    run = run_folder(root, TINY)
    settings = json.dumps({"scale": "embedded", "tables": ["table1", "data_centric"]})
    claims_file = str(root / "workflow/claims.yaml")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradinv.cli",
            "claims",
            "--settings",
            settings,
            "--claims",
            claims_file,
        ],
        cwd=run,  # the run's results/, as the claims job reads them
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    claims = pd.read_csv(run / "results/claims.csv").set_index("id")
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
    assert "SCALED-DOWN" in (run / "results/claims.md").read_text()


@pytest.mark.slow
def test_the_report_shows_table_i_as_a_table_and_a_figure_in_a_browser(tiny_run):
    """``snakemake --report``: Table I under its paper, its page a real HTML table with the
    figure inline, and the figure itself, as a person sees them in a headless Chromium.
    With GRADINV_SCREENSHOTS=<folder> the views are saved there (docs/images)."""
    root = tiny_run
    run = run_folder(root, TINY)
    report = run / "results/report.html"
    proc = snakemake(*TARGETS, "--report", str(report), "--configfile", TINY, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shots = os.environ.get("GRADINV_SCREENSHOTS")
    with browser_page() as page:
        page.goto(report.as_uri())
        page.get_by_text("Results", exact=True).click()
        page.get_by_text("CENSOR (NDSS 2025)").first.click()
        if page.get_by_text("Table I", exact=True).count():  # a subcategory, with several
            page.get_by_text("Table I", exact=True).first.click()
        row = page.locator("tr", has=page.get_by_text("table", exact=True))
        row.locator("a[iconname=eye]").click()
        frame = page.frame_locator("iframe").first
        heading = frame.locator("h1")
        heading.wait_for()
        assert heading.inner_text().startswith("CENSOR (NDSS 2025) Table I")
        table = frame.locator("table").first
        assert table.locator("th").first.inner_text() == "dataset"
        assert "No Defense" in table.inner_text() and "PSNR↓" in table.inner_text()
        assert frame.locator("img[src^='data:image/png']").count() == 1  # the figure, inline
        assert frame.get_by_text("SCALED-DOWN run").count() >= 1
        if shots:
            screenshot(page, Path(shots) / "report-table1.png")
        figure = page.locator("tr", has=page.get_by_text("figure", exact=True))
        figure.locator("a[iconname=eye]").click()
        image = page.locator("img[src^='data:image/png']").first
        image.wait_for()
        assert image.evaluate("i => i.naturalWidth") > 300  # decoded: a real picture
        if shots:
            screenshot(page, Path(shots) / "report-table1-figure.png")


@pytest.mark.slow
def test_the_mlflow_ui_shows_an_attack_runs_metrics_and_its_image(tiny_run):
    """The tiny run's MLflow store in the real UI (``mlflow server`` on it, headless Chromium):
    an attack run named by its defense and attack, its metrics, the metrics it could not compute
    and why, and one side-by-side picture of the original and the reconstruction. The runs,
    logged when the workflow ended, carry their jobs' own start and end times."""
    root = tiny_run
    with sqlite3.connect(root / "mlflow.db") as db:
        attacks = db.execute(
            "select r.run_uuid, r.experiment_id, r.name, r.start_time, r.end_time "
            "from runs r join tags t on r.run_uuid = t.run_uuid "
            "where t.key = 'gradinv.kind' and t.value = 'attack' and r.lifecycle_stage = 'active'"
        ).fetchall()
        kind = db.execute(
            "select value from experiment_tags where key = 'mlflow.experimentKind'"
        ).fetchall()
        unavailable = dict(
            db.execute(
                "select run_uuid, value from tags where key = 'gradinv.unavailable_metrics'"
            ).fetchall()
        )
    assert kind and {k for (k,) in kind} == {"custom_model_development"}
    # each job's own time: an attack job (a process that imports torch) lasts over a second,
    # where a run stamped when the workflow flushed it lasted ~100 ms
    assert all(end - start > 1000 for *_, start, end in attacks)
    run_id, experiment, name, _, _ = next(a for a in attacks if "censor × ig" in a[2])
    assert name.startswith("censor × ig, victim 0")
    image = "images/victim0_0_original_vs_reconstruction.png"
    shots = os.environ.get("GRADINV_SCREENSHOTS")
    log = root / "mlflow-server.log"
    with mlflow_server(f"sqlite:///{root / 'mlflow.db'}", log=log, cwd=root) as base:
        view = "?workflowType=machine_learning"
        with browser_page() as page:
            page.goto(f"{base}/#/experiments/{experiment}/runs/{run_id}{view}")
            page.get_by_text("Metrics (", exact=False).first.wait_for(timeout=60_000)
            body = page.inner_text("body")
            assert name in body
            assert "psnr" in body and "ssim" in body and "attack_seconds" in body
            if run_id in unavailable:  # LPIPS without its weights: said, in the description
                assert "Unavailable metrics (not logged, never faked): lpips:" in body
                assert "lpips" not in body.split("Metrics (")[1].split("Parameters (")[0]
            if shots:
                screenshot(page, Path(shots) / "mlflow-attack-run.png")
            page.goto(f"{base}/#/experiments/{experiment}/runs/{run_id}/artifacts/{image}{view}")
            picture = page.locator("img[src^='blob:']").first
            picture.wait_for(timeout=60_000)
            page.wait_for_function(
                "i => i.complete && i.naturalWidth > 0", arg=picture.element_handle()
            )
            size = picture.evaluate("i => [i.naturalWidth, i.naturalHeight]")
            assert size == [(32 + 2 + 32) * 4, 32 * 4]  # original | reconstruction, 4x, sharp
            if shots:
                screenshot(page, Path(shots) / "mlflow-attack-image.png")


# The two tests below add runs to the tiny run's folder (the sweeps test adds an overlay): they
# come after every test that reads it as the two tables left it (test_tiny_end_to_end_run counts
# its MLflow runs).


@pytest.mark.slow
def test_tiny_utility_table_reports_every_defense_beside_no_defense(tiny_run):
    """The utility study of every defense at tiny.yaml's two seeds, reusing the tiny run's data
    and utility runs."""
    root = tiny_run
    proc = snakemake("results/utility.csv", "--cores", "2", "--configfile", TINY, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_folder(root, TINY)
    table = pd.read_csv(run / "results/utility.csv")
    cfg = yaml.safe_load((root / "params.yaml").read_text())
    assert list(table["defense"]) == cfg["utility"]["defenses"]
    assert (table["status"] == "ok").all() and table["accuracy"].between(0, 100).all()
    assert (table["seeds"] == 2).all()  # tiny.yaml's two seeds
    runs = pd.read_csv(run / "results/utility_runs.csv")
    assert len(runs) == 2 * len(table)
    # PMM: each run over no defense's at the same seed, averaged (the CSV keeps 6 digits)
    by_seed = runs.pivot(index="seed", columns="defense", values="accuracy")
    pmm = (by_seed.div(by_seed["none"], axis=0)).mean()
    relative = table.set_index("defense")["relative_accuracy"]
    assert ((relative - pmm[relative.index]).abs() < 1e-4).all()
    dp = table.set_index("defense").loc["dp_sgd"]
    assert 0 < dp["epsilon"] < float("inf")
    assert table.set_index("defense")["epsilon"].drop("dp_sgd").isna().all()
    summary = json.loads(
        (run / "results/utility/common/patches/cnn3/cvb/seed1/summary.json").read_text()
    )
    assert summary["seed"] == 1
    assert summary["status"] == "ok"
    # the extended model is what the server saved: the attacker rebuilds the bottleneck from it
    saved = load_tensors(run / "results/utility/common/patches/cnn3/cvb/seed0/final.pt")
    assert saved["model"]["extension"]["kind"] == "cvb"
    assert any("decoder" in k for k in saved["state"])
    md = (run / "results/utility.md").read_text()
    assert "SCALED-DOWN" in md and "PRECODE" in md


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
def test_sweeps_several_models_the_frontier_and_client_time_end_to_end(tiny_run):
    """Issue 9's new kinds of target in one Snakemake run: a sweep's variants (names with a
    dot) trained, attacked and given their own utility runs, the one at its base's value read
    from the base's runs; a table over two models; the
    frontier from the strongest attack per metric; Refiner's Table 4 from timed client updates.
    The jobs it shares with the tiny run (the data, the evaluation network, no defense's and
    Noise's trainings, the victims) run once."""
    root = tiny_run
    (root / "tests/configs/sweeps.yaml").write_text(SWEEPS_OVERLAY)
    targets = ("results/frontier.png", "results/cvb_table5.csv", "results/refiner_table4_time.csv")
    overlays = ("--configfile", TINY, "tests/configs/sweeps.yaml")
    proc = snakemake(*targets, "--cores", "2", *overlays, cwd=root, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_folder(root, TINY)

    frontier = pd.read_csv(run / "results/frontier.csv").set_index("defense")
    assert list(frontier.index) == ["none", "noise-std0.001", "noise-std0.01"]
    assert list(frontier["value"].iloc[1:]) == [0.001, 0.01]
    # the point at the base's value ran once, as the base, and is shown under its own name
    assert (run / "results/utility/common/patches/cnn3/noise/seed0/summary.json").is_file()
    assert not list((run / "results").rglob("noise-std0.01"))
    assert frontier.loc["noise-std0.01", ["psnr", "pmm"]].notna().all()  # from noise's files
    assert set(frontier["psnr_attack"]) <= {"IG", "IG+EOT"}
    assert frontier["pmm"].notna().all() and frontier.loc["none", "pmm"] == 1.0
    assert (run / "results/frontier.png").stat().st_size > 0
    # the table behind it drawn as Refiner's figures are: PMM against each metric, per sweep
    assert (run / "results/figures/frontier_runs.png").stat().st_size > 0

    cells = pd.read_csv(run / "results/cvb_table5_cells.csv")
    assert set(cells["model"]) == {"cnn3", "vit"}
    asr = cells[cells["metric"] == "attack_success"]["mean"]
    assert asr.between(0, 1).all() and len(asr) == 6  # 2 models x 3 defenses, IG (Ignore)
    accuracy = cells[cells["metric"] == "accuracy"]
    assert accuracy["mean"].notna().all()  # each model's own utility runs
    assert len(pd.read_csv(run / "results/cvb_table5.csv")) == 6

    times = pd.read_csv(run / "results/refiner_table4_time.csv").set_index("defense")
    assert list(times.index) == ["sparsi", "refiner_warm"]
    assert (times[["lenet", "vit"]] > 0).all().all()
    # Refiner's warm start: later calls reuse the robust data, the first call has none
    warm = json.loads((run / "results/client_time/patches/lenet/refiner_warm.json").read_text())
    assert len(warm["timed_seconds"]) == 2 and warm["first_call_seconds"] > 0
    assert "(0.1418)" in (run / "results/refiner_table4_time.md").read_text()  # the paper's
    vs = pd.read_csv(run / "results/refiner_table4_time_vs_paper.csv")
    assert len(vs) == 4 and vs["paper"].notna().all()  # the paper reports LeNet and ViT
