"""Parallel tracking: with --cores 4 every job's run is in MLflow exactly once, no job fails on
a locked store, and a tracking failure is reported without failing the science job.

(Store-level races, 6 processes logging at once and a locked database retried, are in
test_tracking.py.)"""

import json
import math
import sqlite3
from pathlib import Path

import pytest

from gradinv.io import load_tensors
from gradinv.tables.files import read_records
from stages import Stages
from test_workflow import run_folder, run_target, workflow_copy


@pytest.mark.slow
@pytest.mark.parametrize("defer", [True, False], ids=["deferred", "live"])
def test_four_parallel_jobs_log_each_run_exactly_once(tmp_path, defer):
    """Deferred (the default: logged when the workflow ends) or live (``tracking.defer:
    false``: each job logs as it ends, four at a time through the store's lock), every job's
    run is there once, with its own start and end."""
    root = workflow_copy(tmp_path)
    overlay = root / "tests/configs/tracking.yaml"
    overlay.write_text(f"tracking: {{defer: {str(defer).lower()}}}\n")
    proc = run_target(
        root, "--cores", "4", "--configfile", "tests/configs/micro.yaml", str(overlay)
    )
    run = run_folder(root, "tests/configs/micro.yaml")
    scored = [r for p in (run / "results/metrics").rglob("*.json") for r in read_records(p)]
    jobs = {  # what logs a run: one summary per training job, one record per scored victim
        "train": len(list((run / "results/train").rglob("summary.json"))),
        "score": len(scored),
    }
    with sqlite3.connect(root / "mlflow.db") as db:
        runs = db.execute(
            "select k.value, j.value from runs r "
            "join tags k on r.run_uuid = k.run_uuid and k.key = 'gradinv.kind' "
            "join tags j on r.run_uuid = j.run_uuid and j.key = 'gradinv.job_key' "
            "where r.lifecycle_stage = 'active'"
        ).fetchall()
    kinds = [kind for kind, _ in runs]
    assert kinds.count("train") == jobs["train"] == 2
    assert kinds.count("attack") == jobs["score"] == 4
    assert len({key for _, key in runs}) == len(runs)  # exactly once per job
    assert not list((root / "mlflow.db.pending").glob("*"))  # nothing left pending
    with sqlite3.connect(root / "mlflow.db") as db:
        times = db.execute(
            "select start_time, end_time from runs where lifecycle_stage = 'active'"
        ).fetchall()
    assert all(end - start > 1000 for start, end in times)  # each job's own time (s, not ms)
    assert not (run / "results/logs/tracking-failures.log").exists()
    assert "could not be logged" not in proc.stderr


def test_a_tracking_failure_is_reported_and_the_job_still_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    s = Stages(tmp_path)
    for step in (
        s.prepare,
        s.partition_data,
        s.floor_image,
        s.train,
        s.select_victim,
        s.capture_update,
        s.run_attack,
    ):
        assert step() == 0
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder should be")
    monkeypatch.setenv("GRADINV_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    assert s.score() == 0  # the science job succeeds ...
    row = s.metrics
    assert row["status"] == "ok"  # ... and its result is on disk
    # beside the attack's values, the floor's: the public split's mean image on the same victim
    floor, victim = load_tensors(s.floor), load_tensors(s.victim)
    public = json.loads(s.partition.read_text())["public"]
    assert floor["public_images"] == len(public) > 0
    mse = float(((floor["image"][None] - victim["images"]) ** 2).mean())
    assert row["floor"]["mse"] == pytest.approx(mse, rel=1e-5)
    assert row["floor"]["psnr"] == pytest.approx(-10 * math.log10(mse), rel=1e-4)
    assert "was not logged" in capsys.readouterr().err  # the failure is in the job's log
    lines = (tmp_path / "results/logs/tracking-failures.log").read_text().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["attack/patches/cnn3/none/ig/0/1/0"]

    from gradinv.pipeline import report_tracking_failures

    report_tracking_failures()  # what the Snakefile prints when the workflow ends
    assert "1 job(s) finished but could not be logged to MLflow" in capsys.readouterr().err


def test_a_deferred_run_reaches_mlflow_at_the_flush_and_a_failed_flush_is_reported(
    tmp_path, monkeypatch, capsys
):
    from gradinv.stages import tracking as stage_tracking

    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    monkeypatch.setenv(stage_tracking.ENV_DEFER, "true")
    db = tmp_path / "mlflow.db"
    pending = stage_tracking.log_job(
        {"scale": "embedded", "seed": 0},
        kind="train",
        run_name="r",
        job_key="train/x",
        params={},
        metrics={"m": 1.0},
        summary={},
    )
    assert pending is not None and not db.exists()  # saved beside the store, not logged

    from gradinv import mlflow_store

    def refuse(*args, **kwargs):
        raise OSError("store refused")

    write_run = mlflow_store.write_run
    monkeypatch.setattr(mlflow_store, "write_run", refuse)  # the flush fails ...
    assert stage_tracking.flush() == 0
    lines = (tmp_path / "results/logs/tracking-failures.log").read_text().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["train/x"]  # ... and says which run
    assert "was not logged" in capsys.readouterr().err
    assert Path(pending).exists()  # still pending

    monkeypatch.setattr(mlflow_store, "write_run", write_run)
    assert stage_tracking.flush() == 1
    with sqlite3.connect(db) as con:
        keys = con.execute("select value from tags where key = 'gradinv.job_key'").fetchall()
    assert keys == [("train/x",)] and not Path(pending).exists()
