"""Numerical failure: a NaN or infinite loss ends that run as failed, with its reason in the
metrics file and in MLflow; tables count failed victims per cell and never average them away."""

import sqlite3

import pytest

from gradinv.io import load_tensors, read_json, save_tensors
from gradinv.tables import collect, render_table
from stages import Stages
from test_tables import run, write


def _mlflow_runs(db):
    with sqlite3.connect(db) as con:
        return con.execute(
            "select r.status, t.value from runs r left join tags t "
            "on r.run_uuid = t.run_uuid and t.key = 'gradinv.failure' "
            "where r.lifecycle_stage = 'active' order by r.start_time"
        ).fetchall()


def test_diverged_training_fails_its_run_and_every_result_downstream(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    # A learning rate of 1e30 overflows the weights in the first rounds; attack the last round.
    s = Stages(tmp_path, fl__lr=1e30, capture__round=4)
    s.all()  # every stage exits 0: a failed run is a result, not a crash
    summary = read_json(s.summary)
    assert summary["status"] == "failed" and "non-finite" in summary["failure"]
    assert summary["history"][0]["round"] == 0  # the rounds before the failure are kept
    assert load_tensors(s.checkpoints[0])["round"] == 0  # round 0 was reached and is real
    assert load_tensors(s.captured_checkpoint)["status"] == "failed"
    assert [run["status"] for run in load_tensors(s.capture)["runs"]] == ["failed"]
    row = s.metrics
    assert row["status"] == "failed" and row["failure"].startswith("training failed: non-finite")
    assert row["psnr"] is None and row["seed"] == 0
    runs = _mlflow_runs(tmp_path / "mlflow.db")
    assert [status for status, _ in runs] == ["FAILED", "FAILED"]  # the train and attack runs
    assert all("non-finite" in reason for _, reason in runs)


def test_a_nan_in_the_shared_update_fails_the_attack(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADINV_PROJECT_ROOT", str(tmp_path))
    s = Stages(tmp_path)
    steps = (s.prepare, s.partition_data, s.floor_image, s.train, s.select_victim)
    for step in (*steps, s.capture_update):
        assert step() == 0
    capture = load_tensors(s.capture)
    update = capture["runs"][0]["update"]["tensors"]  # victim 0, the job's only one
    update[next(iter(update))].view(-1)[0] = float("nan")
    save_tensors(s.capture, capture)
    assert s.run_attack() == 0 and s.score() == 0
    row = s.metrics
    assert row["status"] == "failed" and "non-finite attack loss" in row["failure"]
    status, reason = _mlflow_runs(tmp_path / "mlflow.db")[-1]
    assert status == "FAILED" and "non-finite attack loss" in reason


def test_tables_count_failed_victims_and_never_average_them(tmp_path):
    failed = {"status": "failed", "failure": "non-finite", "mse": None, "psnr": None, "ssim": None}
    paths = write(
        tmp_path, [run(victim=0, psnr=20.0), run(victim=1, psnr=10.0), run(victim=2, **failed)]
    )
    assert len(collect(paths)) == 3  # the failed victim is kept, not dropped
    render_table(
        "t",
        paths,
        tmp_path / "out",
        attacks=["ig"],
        defenses=["none"],
        datasets=["patches"],
        setting={},
        scaled_down_note="A test.",
        reference_csv=None,
        title="T",
        reproduces="T",
    )
    import csv

    (row,) = csv.DictReader((tmp_path / "out" / "t.csv").open())
    psnr = {k.split(" ", 2)[-1]: v for k, v in row.items() if k.startswith("IG PSNR")}
    assert psnr["mean"] == "15.0" or float(psnr["mean"]) == pytest.approx(15.0)
    assert int(psnr["failed"]) == 1 and int(psnr["n"]) == 2
