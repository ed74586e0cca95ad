"""The Snakemake workflow: dry runs of every paper target, lint, bad config, one tiny real run."""

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PAPER = "workflow/configs/paper.yaml"


def quiet_env() -> dict[str, str]:
    """The environment with MLflow's and DVC's telemetry off, for the tools the tests start."""
    return {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


def snakemake(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SNAKEMAKE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=quiet_env(),
    )


def run_target(root: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """Build results/table1.csv in ``root`` with its own MLflow store (``root``/mlflow.db)."""
    env = {k: v for k, v in os.environ.items() if k != "GRADINV_TRACKING_URI"}
    proc = subprocess.run(
        [*SNAKEMAKE, "results/table1.csv", *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def run_folder(root: Path, overlay: str) -> Path:
    """Where a run with ``overlay`` writes in the workflow copy ``root``: the overlay's run_dir."""
    return root / yaml.safe_load((ROOT / overlay).read_text()).get("run_dir", ".")


def workflow_copy(tmp_path: Path) -> Path:
    """The workflow in a fresh folder, as a fresh clone would have it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "params.yaml", "environment.yml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "workflow", tmp_path / "workflow")
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    shutil.copytree(ROOT / "tests" / "configs", tmp_path / "tests" / "configs")
    return tmp_path


@pytest.mark.parametrize("overlay", [None, PAPER], ids=["default", "paper"])
def test_dry_run_builds_the_table1_dag(tmp_path, overlay):
    root = workflow_copy(tmp_path)
    args = ["-n", "results/table1.csv", "--cores", "1", "--quiet", "rules"]
    if overlay:
        args += ["--configfile", overlay]
    proc = snakemake(*args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    for rule in ("prepare_data", "train", "capture", "attack", "score", "report"):
        assert rule in proc.stdout


def test_paper_dag_has_every_dataset_defense_and_victim(tmp_path):
    root = workflow_copy(tmp_path)
    proc = snakemake(
        "-n",
        "results/table1.csv",
        "--cores",
        "1",
        "--configfile",
        PAPER,
        "--quiet",
        "rules",
        cwd=root,
    )
    counts = {
        line.split()[0]: int(line.split()[1])
        for line in proc.stdout.splitlines()
        if len(line.split()) == 2 and line.split()[1].isdigit()
    }
    # datasets x defenses (Table I's six, CENSOR in both readings) x attacks (IG, GI, GGL, GIAS,
    # GIFD) x victims
    assert counts["attack"] == 3 * 7 * 5 * 10
    assert counts["fetch_generator"] == 2  # BigGAN (ImageNet, CIFAR-10), StyleGAN2 (FFHQ)
    assert counts["train"] == 3 * 7


CENSOR_TARGETS = (
    "results/table3_eot.csv",
    "results/table5_rounds.csv",
    "results/table7_layerwise.csv",
    "results/fig9_trials.csv",
    "results/fig7_accuracy.png",
    "results/table6_clients.csv",
)


def job_counts(stdout: str) -> dict[str, int]:
    return {
        line.split()[0]: int(line.split()[1])
        for line in stdout.splitlines()
        if len(line.split()) == 2 and line.split()[1].isdigit()
    }


@pytest.mark.parametrize("overlay", [None, PAPER], ids=["default", "paper"])
def test_censor_experiments_dry_run(tmp_path, overlay):
    """CENSOR's Tables III, V, VII, Figs. 7-9 and Table VI: one DAG, the expected job counts."""
    root = workflow_copy(tmp_path)
    args = ["-n", *CENSOR_TARGETS, "--cores", "1", "--quiet", "rules"]
    if overlay:
        args += ["--configfile", overlay]
    proc = snakemake(*args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    cfg = yaml.safe_load((root / "params.yaml").read_text())
    # Every table runs CENSOR in both readings (fallback algorithm-1 and never-raw): 2 families.
    if overlay:
        # The overlay: 10 victims; Table III on ImageNet and FFHQ, the others on ImageNet.
        eot, rounds, layer, trials = 2 * 2 * 2 * 10, 2 * (10 * 10 - 10), 2 * 10, 2 * 5 * 10
        undefended = (2 + 1) * 10  # GIFD on ImageNet and FFHQ, GIAS on ImageNet
        k = [10, 30, 50]
    else:
        # an attack job per victims_per_job victims (the overlay: one each)
        # (each table's victims; the round-0 runs of Tables V and VII, no more victims than
        # Table III's, are Table III's first jobs)
        v = {
            t: -(-cfg["tables"][t]["victims"] // cfg["victims_per_job"])
            for t in ("table3_eot", "table5_rounds", "table7_layerwise", "fig9_trials")
        }
        assert max(v["table5_rounds"], v["table7_layerwise"]) <= v["table3_eot"]
        eot, rounds = 2 * 2 * v["table3_eot"], 2 * (10 * v["table5_rounds"] - v["table5_rounds"])
        layer, trials = 2 * v["table7_layerwise"], 2 * 5 * v["fig9_trials"]
        undefended = 2 * -(-cfg["capture"]["victims"] // cfg["victims_per_job"])  # GIFD, GIAS
        k = cfg["convergence"]["clients_per_round"]
    # Attacks: Table III (each CENSOR x {gifd, gifd_eot}), Table V (GIFD, rounds 1-9 beyond
    # Table III's round 0), Table VII (the whole-model variants), Fig. 9 (GIAS, five T each);
    # shared runs counted once; and Table I's undefended GIFD and GIAS, which say whether each
    # attack works at all (none of these tables has an undefended row).
    assert counts["attack"] == eot + rounds + layer + trials + undefended
    assert counts["report"] == 4 and counts["report_convergence"] == 1
    # Convergence: one run per curve at the default K, plus Table VI's defenses at every K.
    conv = cfg["convergence"]
    default_k = (
        (conv["fl"] | yaml.safe_load((root / PAPER).read_text())["convergence"]["fl"])[
            "clients_per_round"
        ]
        if overlay
        else conv["fl"]["clients_per_round"]
    )
    runs = {(d, default_k) for d in conv["defenses"]}
    runs |= {(d, kk) for d in conv["clients_defenses"] for kk in k}
    assert counts["train_convergence"] == len(runs)
    # The official code's loop: one central run per defense, no partition, no K.
    assert counts["train_convergence_official"] == len(conv["official_loop"]["defenses"])


@pytest.mark.parametrize("overlay", [None, PAPER], ids=["default", "paper"])
def test_utility_dry_run_trains_every_defense_once(tmp_path, overlay):
    root = workflow_copy(tmp_path)
    args = ["-n", "results/utility.csv", "--cores", "1", "--quiet", "rules"]
    if overlay:
        args += ["--configfile", overlay]
    proc = snakemake(*args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    study = yaml.safe_load((root / "params.yaml").read_text())["utility"]
    if overlay:
        study |= yaml.safe_load((root / overlay).read_text())["utility"]
    runs = len(study["defenses"]) * len(study["seeds"])  # every defense at every seed
    assert counts["train_utility"] == runs and counts["report_utility"] == 1
    assert "train" not in counts  # the utility runs are their own, with the study's FL setting


def test_data_centric_dry_run_captures_the_malicious_server_apart(tmp_path):
    """Refiner, DCS² and Imprint in one table (workflow/configs/data_centric.yaml): the honest
    capture per defense and job's victims, one more per malicious attack, one evaluation
    network."""
    root = workflow_copy(tmp_path)
    overlay = "workflow/configs/data_centric.yaml"
    proc = snakemake(
        "-n",
        "results/data_centric.csv",
        "evaluation_networks",
        "--configfile",
        overlay,
        "--cores",
        "1",
        "--quiet",
        "rules",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    table = yaml.safe_load((root / overlay).read_text())["tables"]["data_centric"]
    params = yaml.safe_load((root / "params.yaml").read_text())
    victims = table.get("victims", params["capture"]["victims"])
    per_job = params["victims_per_job"]
    jobs = len(table["defenses"]) * -(-victims // per_job)  # a job per victims_per_job victims
    assert counts["capture"] == jobs and counts["capture_malicious"] == jobs  # Imprint's
    assert counts["attack"] == jobs * len(table["attacks"])
    assert counts["train_evalnet"] == 1  # the noise ratio's and Refiner's, one per dataset


def mlflow_experiments_with_runs(store: Path) -> dict[str, int]:
    """Each MLflow experiment of the SQLite store ``store`` that holds runs, and how many."""
    import sqlite3

    with sqlite3.connect(store) as db:
        rows = db.execute(
            "SELECT e.name, COUNT(*) FROM runs r JOIN experiments e "
            "ON r.experiment_id = e.experiment_id GROUP BY e.name"
        ).fetchall()
    return dict(rows)


@pytest.mark.slow
def test_each_overlay_writes_to_its_own_folder_so_switching_reruns_nothing(tmp_path):
    """The micro overlay's Table I and its report land in runs/micro (its run_dir); the default
    scale's first job after it writes the project's own data/ and leaves the micro table up to
    date (when the two shared results/ and data/, the default's data made the micro's table
    start again from its first job). One MLflow store, the overlay's own experiment."""
    root = workflow_copy(tmp_path)
    micro = ("--configfile", "tests/configs/micro.yaml")
    run_target(root, "--cores", "2", *micro)
    run = root / "runs" / "micro"
    assert (run / "results" / "table1.csv").is_file()
    assert not (root / "results").exists() and not (root / "data").exists()
    victims = json.loads(next((run / "results" / "metrics").rglob("v*.json")).read_text())
    recorded = victims["runs"][0]["victim_file"]  # relative to the run's folder
    assert not Path(recorded).is_absolute() and (run / recorded).is_file()

    report = snakemake("results/table1.csv", "--report", "results/report.html", *micro, cwd=root)
    assert report.returncode == 0, report.stderr[-3000:]
    assert (run / "results" / "report.html").stat().st_size > 100_000

    default = snakemake("data/prepared/patches.pt", "--cores", "1", cwd=root)
    assert default.returncode == 0, default.stderr[-3000:]
    ours, theirs = (json.loads((r / "data/prepared/patches.json").read_text()) for r in (run, root))
    assert ours["num_train"] != theirs["num_train"]  # the micro overlay's smaller data set
    again = snakemake("-n", "results/table1.csv", *micro, cwd=root)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr

    runs = mlflow_experiments_with_runs(root / "mlflow.db")
    assert set(runs) == {"gradinv-micro"} and runs["gradinv-micro"] >= 2


def test_every_source_a_dvc_stage_depends_on_exists():
    """A moved module must not leave a DVC stage depending on a path that is gone: DVC would
    refuse `dvc repro` on a fresh clone ("missing dependencies")."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    made = ("results/", "data/")  # outputs of the workflow, absent on a fresh clone
    missing = [
        f"{name}: {dep}"
        for name, stage in stages.items()
        for dep in (next(iter(d)) if isinstance(d, dict) else d for d in stage.get("deps", []))
        if "${" not in dep and not dep.startswith(made) and not (ROOT / dep).exists()
    ]
    assert not missing, missing
    assert stages["evalnet"]["deps"] and stages["claims"]["deps"]  # the check read the stages


def test_dvc_leaves_every_out_to_snakemake():
    """DVC deletes a stage's outs before running it unless they persist; each stage's command is
    a Snakemake target, which would then rebuild from nothing what was up to date (`dvc repro`
    after `snakemake all` would retrain every model). Read as DVC reads dvc.yaml, foreach
    stages expanded from params.yaml."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        outs = [
            (stage.addressing, str(out), out.persist)
            for stage in repo.index.stages
            for out in stage.outs
        ]
    assert len(outs) > 100 and any(path == "results/checkpoints" for _, path, _ in outs)
    assert all(persist for _, _, persist in outs), [o for o in outs if not o[2]]


@pytest.mark.parametrize("overlay", [None, PAPER], ids=["default", "paper"])
def test_the_data_stage_builds_every_file_under_its_outs(tmp_path, overlay):
    """dvc.yaml's `data` stage owns data/prepared and data/partitions whole: a file that a later
    stage wrote into them (the convergence study's clients, a recipe's own) would change the
    data stage's outs, and `dvc status` would call it changed after every run. So `prepared_data`
    builds every file any job of `all` writes there."""
    root = workflow_copy(tmp_path)
    extra = ["--configfile", overlay] if overlay else []

    def written(target: str) -> set[str]:
        proc = snakemake("-n", "--forceall", target, "--cores", "1", *extra, cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {
            path
            for line in proc.stdout.splitlines()
            if line.strip().startswith("output:")
            for path in line.split(":", 1)[1].replace(",", " ").split()
            if path.startswith(("data/prepared/", "data/partitions/"))
        }

    in_all, in_stage = written("all"), written("prepared_data")
    # the check read the outputs: the convergence study's clients and CENSOR's recipe's
    assert {p.split(".")[-2] for p in in_all} >= {"convergence", "censor"}
    assert in_all <= in_stage, sorted(in_all - in_stage)


def test_dvc_repro_after_snakemake_keeps_its_files(tmp_path):
    """`dvc repro` after Snakemake has built a stage's outs runs the stage's Snakemake target,
    which finds them up to date: the files are the ones Snakemake wrote (same inode, same time),
    not deleted and rebuilt."""
    root = workflow_copy(tmp_path)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    dvc = [sys.executable, "-m", "dvc"]
    run = functools.partial(
        subprocess.run, cwd=root, capture_output=True, text=True, env=quiet_env()
    )
    assert run([*dvc, "init", "--no-scm", "-q"]).returncode == 0
    proc = snakemake("prepared_data", "--cores", "1", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted((root / "data/prepared").iterdir())
    before = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}
    assert before
    proc = run([*dvc, "repro", "data"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}
    assert after == before
    assert "data" in yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def test_lint_is_clean():
    proc = snakemake("--lint", "--cores", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_a_bad_config_stops_snakemake_before_any_job(tmp_path):
    root = workflow_copy(tmp_path)
    cfg = yaml.safe_load((root / "params.yaml").read_text())
    cfg["defenses"]["noise"]["std"] = -1
    (root / "params.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake("results/table1.csv", "--cores", "1", cwd=root)
    assert proc.returncode != 0
    assert "defenses.noise.std: -1 is out of range" in proc.stdout + proc.stderr
    assert not (root / "results").exists()


@pytest.mark.slow
def test_tiny_convergence_study_runs_both_loops(tmp_path):
    """Figs. 7-8 and Table VI for real, on the tiny overlay: FL curves and the official loop."""
    root = workflow_copy(tmp_path)
    tiny = "tests/configs/tiny.yaml"
    proc = snakemake("results/table6_clients.csv", "--cores", "2", "--configfile", tiny, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_folder(root, tiny)
    curves = pd.read_csv(run / "results/convergence.csv")
    cfg = yaml.safe_load((root / tiny).read_text())["convergence"]
    official = curves[curves["loop"].str.startswith("official")]
    assert set(official["defense"]) == set(cfg["official_loop"]["defenses"])
    assert sorted(set(official["round"])) == list(range(cfg["official_loop"]["epochs"] + 1))
    fl = curves[curves["loop"].str.startswith("FL")]
    assert fl["round"].max() == cfg["fl"]["rounds"]
    assert curves["test_accuracy"].between(0, 1).all()
    md = (run / "results/table6_clients.md").read_text()
    assert "SCALED-DOWN" in md and "## The official code's loop" in md
    for defense in cfg["official_loop"]["defenses"]:
        loop = run / f"results/convergence/patches/cnn3/{defense}/official"
        assert (loop / "final.pt").stat().st_size > 0
        assert json.loads((loop / "summary.json").read_text())["status"] == "ok"
    wide = Image.open(run / "results/fig7_accuracy.png").size
    assert wide[0] > 1.5 * wide[1]  # two panels side by side


def test_table2_attacks_batches_of_four_with_distinct_labels(tmp_path):
    """CENSOR's Table II: its own batch size in every path, victims of four different classes."""
    root = workflow_copy(tmp_path)
    proc = snakemake("-n", "results/table2.csv", "--cores", "1", "-p", cwd=root)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "results/victims/patches/b4/victim3.pt" in out and "--distinct-labels" in out
    assert "r0_b4/gifd/victims0-7" in out and "_b1/" not in out  # 8 victims, victims_per_job 8
    from gradinv.stages.capture import victim_indices

    labels = [0] * 5 + [1] * 5 + [2] * 5
    assert victim_indices(0, 3, 2, labels, distinct=True) == [0, 5, 10]
    assert victim_indices(1, 3, 2, labels, distinct=True) == [2, 6, 11]  # 5, 10: victim 0's
    assert victim_indices(1, 3, 2, labels) == [2, 3, 4]
    # from 6 on, 6, 7 and 10-12 are victims 0-2's; past the end, on from the first image
    assert victim_indices(3, 3, 2, labels, distinct=True) == [8, 13, 1]
    with pytest.raises(ValueError, match="only 2 distinct labels among the 10 validation images,"):
        victim_indices(0, 3, 2, labels[:10], distinct=True)
    with pytest.raises(
        ValueError, match=r"only 0 distinct labels .* \(less those of victims 0..1\)"
    ):
        victim_indices(2, 2, 1, [0, 0, 1, 1], distinct=True)


def test_victims_of_a_batch_share_no_image():
    """The patches' labels run in blocks of 100 (a photograph each): without passing over the
    images earlier victims took, every victim starting in a block would share the next blocks'
    first images (Table II's victims 0 and 1 shared 3 of 4). Each victim's batch also stays
    the same whatever the number of victims after it."""
    from gradinv.stages.capture import victim_indices

    labels = [i // 100 for i in range(1500)]
    for batch_size, n in ((2, 24), (4, 8)):  # DCS² Table 1's, Table II's
        batches = [victim_indices(v, batch_size, 93, labels, distinct=True) for v in range(n)]
        images = [i for batch in batches for i in batch]
        assert len(set(images)) == len(images) == n * batch_size
        assert all(len({labels[i] for i in batch}) == batch_size for batch in batches)
        assert [batch[0] for batch in batches] == [v * 93 % 1500 for v in range(n)]
    assert victim_indices(1, 4, 93, labels, distinct=True) == [93, 101, 201, 301]
    # victim 16 starts in the last label's block (1488): its other label comes from the start
    assert victim_indices(16, 2, 93, labels, distinct=True) == [1488, 1]


def test_victims_beyond_one_pass_of_the_stride_wrap_around():
    """params.yaml's stride 93 puts 16 victims in one pass of the 1500 validation patches; victim
    16 on start again between them (1488, then 81, 174, ...), each first pass victim keeping its
    image, and the cross-check refuses victims whose batches would share an image."""
    from gradinv.cross_checks import victim_clash
    from gradinv.stages.capture import victim_indices

    labels = [i // 100 for i in range(1500)]
    assert [victim_indices(v, 1, 93, labels) for v in (1, 15, 16, 17, 18)] == [
        [93],
        [1395],
        [1488],
        [81],
        [174],
    ]
    starts = {victim_indices(v, 1, 93, labels)[0] for v in range(40)}
    assert len(starts) == 40
    assert victim_clash(40, 93, 1, 1500) == ""
    assert victim_clash(18, 93, 4, 1500) == ""  # 81 and 93 are 12 apart; 1488..1491 fits
    assert victim_clash(18, 93, 13, 1500) == "victims 17 and 1 share validation images from 93 on"
    assert victim_clash(501, 93, 1, 1500) == "victims 0 and 500 share validation images from 0 on"
    assert victim_clash(1, 0, 2000, 1500) == "victim 0 needs validation images 0..1999"


def test_dvc_metrics_and_plots_show_what_the_results_hold(tmp_path):
    """`dvc metrics show` lists each table's headline numbers and the claims' verdict counts;
    `dvc plots show` renders the convergence curves and the frontier, a line per defense. On
    result files the stages' own writers made (a table rendered from synthetic records, the
    claims' summary, a convergence and a frontier file in their stages' columns)."""
    import json

    from test_tables import grid_records, render_records

    root = workflow_copy(tmp_path / "project")
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    results = root / "results"
    render_records(tmp_path, grid_records(), results)
    (results / "claims_summary.json").write_text(json.dumps({"holds": 3, "fails": 1}))
    pd.DataFrame(
        {
            "loop": ["FL"] * 4,
            "defense": ["none", "none", "censor", "censor"],
            "label": ["No Defense", "No Defense", "Censor", "Censor"],
            "clients_per_round": [2] * 4,
            "round": [0, 20, 0, 20],
            "test_accuracy": [0.1, 0.4, 0.1, 0.35],
            "test_loss": [2.3, 1.5, 2.3, 1.6],
        }
    ).to_csv(results / "convergence.csv", index=False)
    pd.DataFrame(
        {"base_label": ["Noise", "Noise", "Censor"], "pmm": [0.9, 0.97, 0.99], "psnr": [12, 15, 8]}
    ).to_csv(results / "frontier.csv", index=False)
    dvc = [sys.executable, "-m", "dvc"]
    run = functools.partial(
        subprocess.run, cwd=root, capture_output=True, text=True, env=quiet_env(), timeout=300
    )
    assert run([*dvc, "init", "--no-scm", "-q"]).returncode == 0
    proc = run([*dvc, "metrics", "show", "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (shown,) = (rev["data"] for rev in json.loads(proc.stdout).values())  # the workspace
    table1 = shown["results/table1_headline.json"]["data"]
    assert table1["victims"] == 3 and table1["failed_runs"] == 0
    assert table1["strongest_attack_psnr_no_defense"] == pytest.approx(21.0)  # victims 20-22
    assert shown["results/claims_summary.json"]["data"] == {"holds": 3, "fails": 1}
    proc = run([*dvc, "plots", "show", "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    plots = json.loads(proc.stdout)
    assert not plots.get("errors"), plots["errors"]
    drawn = {name: p[0]["content"] for name, p in plots["data"].items()}
    accuracy = drawn["CENSOR Fig. 7, test accuracy over training"]
    assert accuracy["encoding"]["color"]["field"] == "label"  # a line per defense
    assert {row["label"] for row in accuracy["data"]["values"]} == {"No Defense", "Censor"}
    frontier = drawn["Utility against privacy, the frontier"]
    assert frontier["encoding"]["x"]["field"] == "pmm" and len(frontier["data"]["values"]) == 3
    assert run([*dvc, "plots", "show", "-o", "plots"]).returncode == 0
    assert (root / "plots" / "index.html").stat().st_size > 0


def test_the_committed_dvc_lock_matches_the_code_and_settings_it_records():
    """dvc.lock records, for each stage `dvc repro` ran, the hashes of its sources and the
    values of its params. A stage recorded there with other sources or settings than the
    checkout's is stale: `make dvc-lock` reruns the stages it keeps (data, generators, evalnet).
    Outs and the workflow's own files (data/, results/) may be absent here: they are made or
    pulled, not committed."""
    from dvc.repo import Repo

    recorded = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    with Repo(str(ROOT)) as repo:
        status = repo.status(targets=list(recorded))
    stale = {}
    for stage, changes in status.items():
        for change in changes if isinstance(changes, list) else []:
            if not isinstance(change, dict):
                continue
            deps = {
                path: how
                for path, how in change.get("changed deps", {}).items()
                if not path.startswith(("data/", "results/")) and how != "deleted"
            }
            params = change.get("changed params", {})
            if deps or params:
                stale[stage] = {"deps": deps, "params": params}
    assert not stale, f"dvc.lock is stale for {stale}: run `make dvc-lock` and commit dvc.lock"
