"""The MLflow mirror: one run per job, safe under parallel jobs, never fatal to a job.

Each test logs to the per-test sqlite store that conftest points ``GRADINV_TRACKING_URI`` at.
Creating MLflow's schema costs seconds, so a migrated empty store is built once per session and
copied in (fmind/mlops-python-package#129).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from gradinv import mlflow_store, tracking
from gradinv.tracking import JOB_KEY_TAG, TrackingWarning

pytest.importorskip("mlflow")

EXP = "gradinv-test"


@pytest.fixture(scope="session")
def _migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # creates the schema
    return db


@pytest.fixture
def store(tmp_path: Path, _migrated_db: Path) -> Path:
    """A project root whose (env-selected) store already has MLflow's schema."""
    uri = os.environ["GRADINV_TRACKING_URI"]
    assert uri == f"sqlite:///{tmp_path}/mlflow.db", "conftest should isolate the store"
    shutil.copy(_migrated_db, tmp_path / "mlflow.db")
    return tmp_path


def _client(root: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking.tracking_uri(root))


def _active_runs(root: Path) -> list:
    client = _client(root)
    exp = client.get_experiment_by_name(EXP)
    return client.search_runs([exp.experiment_id], max_results=1000) if exp else []


def _log(root: Path, job_key: str, **kwargs):
    args = {"params": {}, "metrics": {"m": 1.0}, **kwargs}
    return tracking.log_run(
        experiment=EXP, run_name=job_key, job_key=job_key, project_root=root, **args
    )


def test_paths_are_absolute_and_overridable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("GRADINV_TRACKING_URI")
    monkeypatch.delenv("GRADINV_ARTIFACT_ROOT", raising=False)
    root = tmp_path.resolve()
    assert tracking.tracking_uri(root) == f"sqlite:///{root}/mlflow.db"
    assert tracking.artifact_root(root) == f"{root}/mlartifacts"
    assert tracking.mlflow_ui_command(root) == (
        f"mlflow ui --backend-store-uri sqlite:///{root}/mlflow.db --port 5000"
    )
    monkeypatch.setenv("GRADINV_TRACKING_URI", "sqlite:///scratch/t.db")
    assert tracking.tracking_uri(root) == f"sqlite:///{root}/scratch/t.db"
    assert tracking.artifact_root(root) == f"{root}/scratch/mlartifacts"
    monkeypatch.setenv("GRADINV_ARTIFACT_ROOT", "/elsewhere/art")
    assert tracking.artifact_root(root) == "/elsewhere/art"


def test_init_store_twice_is_idempotent(store: Path):
    tracking.init_store(store, EXP)
    tracking.init_store(store, EXP)
    client = _client(store)
    names = [e.name for e in client.search_experiments()]
    assert names.count(EXP) == 1
    exp = client.get_experiment_by_name(EXP)
    assert exp.artifact_location == (store / "mlartifacts").as_uri()


def test_log_run_records_params_metrics_history_image_artifact_tags(store: Path):
    import torch

    table = store / "metrics.json"
    table.write_text('{"psnr": 20.5}')
    many = {f"p{i}": i for i in range(150)}  # more than one log_batch of params
    run_id = tracking.log_run(
        experiment=EXP,
        run_name="ig/cifar10",
        job_key="results/attack/cifar10/resnet18/none/ig/metrics.json",
        params={
            "attack": {"name": "ig", "lr": 0.1, "tv": {"weight": 1e-4}},
            "long": "x" * 9000,
            **many,
        },
        metrics={"psnr": 20.5, "lpips": None, "ssim": float("nan"), "acc": torch.tensor(0.25)},
        history={"loss": [(step, 1.0 / (step + 1)) for step in range(1200)]},
        tags={"gradinv.rule": "attack"},
        artifacts={"tables": table},
        images={"reconstruction": torch.rand(3, 8, 6), "truth": np.random.rand(8, 6, 3)},
        project_root=store,
    )
    assert run_id is not None
    client = _client(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["attack.name"] == "ig"
    assert params["attack.tv.weight"] == "0.0001"
    assert len(params["long"]) == 6000  # MLflow's param value limit
    assert params["p149"] == "149"
    metrics = run.data.metrics
    assert metrics["psnr"] == 20.5 and metrics["acc"] == 0.25
    assert math.isnan(metrics["ssim"]) and "lpips" not in metrics
    history = client.get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1200))
    tags = run.data.tags
    assert tags[JOB_KEY_TAG] == "results/attack/cifar10/resnet18/none/ig/metrics.json"
    assert tags["gradinv.metrics_none"] == "lpips"
    assert "ssim=nan" in tags["gradinv.metrics_nonfinite"]
    assert tags["gradinv.rule"] == "attack"
    assert {"gradinv.git_commit", "gradinv.python", "gradinv.torch"} <= set(tags)
    images = {a.path for a in client.list_artifacts(run_id, "images")}
    assert images == {"images/reconstruction.png", "images/truth.png"}
    assert [a.path for a in client.list_artifacts(run_id, "tables")] == ["tables/metrics.json"]
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(store)


def test_same_job_key_twice_leaves_one_run(store: Path):
    first = _log(store, "job/a", metrics={"m": 1.0})
    second = _log(store, "job/a", metrics={"m": 2.0})
    _log(store, "job/b")
    runs = _active_runs(store)
    assert sorted(r.data.tags[JOB_KEY_TAG] for r in runs) == ["job/a", "job/b"]
    kept = next(r for r in runs if r.data.tags[JOB_KEY_TAG] == "job/a")
    assert kept.info.run_id == second != first
    assert kept.data.metrics["m"] == 2.0


def _worker(root: str, worker: int) -> list[str]:
    """One 'Snakemake job process' logging three runs; returns any tracking warnings.

    Torch is imported only inside the tests that need it: these spawned children import this
    module, and on two cores four torch imports would double the test's time.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            run_id = _log(
                Path(root),
                f"w{worker}/job{i}",
                params={"worker": worker, "i": i},
                history={"loss": [(s, float(s)) for s in range(50)]},
            )
            assert run_id is not None
    return [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]


def test_parallel_processes_each_run_exactly_once(store: Path):
    tracking.init_store(store, EXP)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_worker, [(str(store), w) for w in range(4)])
    assert results == [[], [], [], []]
    keys = sorted(r.data.tags[JOB_KEY_TAG] for r in _active_runs(store))
    assert keys == sorted(f"w{w}/job{i}" for w in range(4) for i in range(3))


def test_broken_store_warns_and_returns_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the store's folder should be")
    monkeypatch.setenv("GRADINV_TRACKING_URI", f"sqlite:///{blocker}/mlflow.db")
    with pytest.warns(TrackingWarning, match="not_a_dir"):
        tracking.init_store(tmp_path, EXP)
    with pytest.warns(TrackingWarning, match="was not logged"):
        assert _log(tmp_path, "job/x") is None


def test_bad_item_is_recorded_not_fatal(store: Path):
    with pytest.warns(TrackingWarning, match="incomplete"):
        run_id = _log(
            store,
            "job/bad",
            images={"batch": np.zeros((2, 3, 4, 4))},
            artifacts={"missing": store / "nope.txt"},
        )
    assert run_id is not None
    errors = _client(store).get_run(run_id).data.tags["gradinv.tracking_errors"]
    assert "image batch" in errors and "nope.txt" in errors


def test_tracking_off_creates_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GRADINV_TRACKING", "off")
    tracking.init_store(tmp_path, EXP)
    assert _log(tmp_path, "job/off") is None
    monkeypatch.delenv("GRADINV_TRACKING")
    assert (
        tracking.log_run(
            experiment=EXP,
            run_name="r",
            job_key="k",
            params={},
            metrics={},
            project_root=tmp_path,
            enabled=False,
        )
        is None
    )
    assert not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "mlflow.db.lock").exists()


def test_leaked_mlflow_run_id_is_ignored(store: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MLFLOW_RUN_ID", "0123456789abcdef0123456789abcdef")
    first = _log(store, "job/1")
    second = _log(store, "job/2")
    assert first and second and first != second
    assert "MLFLOW_RUN_ID" not in os.environ


def test_provenance_without_git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import torch

    info = tracking.provenance(tmp_path)
    assert info["git_commit"] == "unknown" and info["git_dirty"] == "unknown"
    assert info["torch"] == torch.__version__
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable at all
    assert tracking.provenance(tmp_path)["git_commit"] == "unknown"
    assert not any(v == os.uname().nodename for v in info.values())


def test_provenance_in_git_repo(tmp_path: Path):
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("1")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    info = tracking.provenance(tmp_path)
    assert len(info["git_commit"]) == 40 and info["git_dirty"] == "false"
    (tmp_path / "f.txt").write_text("2")
    assert tracking.provenance(tmp_path)["git_dirty"] == "true"


def test_locked_database_is_retried(store: Path, monkeypatch: pytest.MonkeyPatch):
    import sqlite3

    calls = []

    def flaky(client):
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("wrapped") from sqlite3.OperationalError("database is locked")
        return "ok"

    monkeypatch.setattr(mlflow_store.time, "sleep", lambda s: None)
    assert mlflow_store.with_store(tracking.tracking_uri(store), flaky) == "ok"
    assert len(calls) == 3
    with pytest.raises(ValueError):  # a real error is not retried
        mlflow_store.with_store(tracking.tracking_uri(store), lambda c: calls.append(1) or int("x"))
    assert len(calls) == 4


def _run_view(root: Path, key: str) -> dict:
    """What a run shows in MLflow, less what differs between any two runs (ids, times, key)."""
    client = _client(root)
    (run,) = [r for r in _active_runs(root) if r.data.tags[JOB_KEY_TAG] == key]
    history = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
    }
    artifacts = sorted(
        a.path
        for folder in ("images", "tables")
        for a in client.list_artifacts(run.info.run_id, folder)
    )
    tags = {
        k: v for k, v in run.data.tags.items() if k != JOB_KEY_TAG and not k.startswith("mlflow.")
    }
    return {
        "status": run.info.status,
        "params": run.data.params,
        "metrics": run.data.metrics,
        "history": history,
        "tags": tags,
        "artifacts": artifacts,
    }


def test_a_deferred_run_is_pending_until_flushed_and_then_the_same_run(store: Path):
    import torch

    table = store / "metrics.json"
    table.write_text('{"psnr": 20.5}')
    rng = np.random.default_rng(0)
    run = {
        "params": {"attack": {"name": "ig", "steps": (1, 2)}, "long": "x" * 9000},
        "metrics": {"psnr": 20.5, "lpips": None, "zero": 0.0, "acc": torch.tensor(0.25)},
        "history": {"loss": [(step, 1.0 / (step + 1)) for step in range(30)] + [(30, 0.0)]},
        "tags": {"gradinv.rule": "attack"},
        "artifacts": {"tables": table},
        "images": {"reconstruction": torch.rand(3, 8, 6), "truth": rng.random((8, 6, 3))},
    }
    now = _log(store, "now", **run)
    pending = _log(store, "later", defer=True, **run)
    assert now is not None and pending is not None
    assert Path(pending).parent == tracking.pending_dir(store) == store / "mlflow.db.pending"
    assert [r.data.tags[JOB_KEY_TAG] for r in _active_runs(store)] == ["now"]  # not yet in MLflow

    assert tracking.flush_pending(store) == (1, [])
    assert not Path(pending).exists()
    assert _run_view(store, "later") == _run_view(store, "now")
    assert tracking.flush_pending(store) == (0, [])  # nothing left


def test_a_rerun_before_the_flush_replaces_its_pending_run(store: Path):
    first = _log(store, "job/a", metrics={"m": 1.0}, defer=True)
    second = _log(store, "job/a", metrics={"m": 2.0}, defer=True)
    assert first == second and len(list(tracking.pending_dir(store).iterdir())) == 1
    assert tracking.flush_pending(store) == (1, [])
    (run,) = _active_runs(store)
    assert run.data.metrics["m"] == 2.0


def test_a_failed_flush_keeps_the_run_pending_for_the_next(
    store: Path, monkeypatch: pytest.MonkeyPatch
):
    pending = Path(_log(store, "job/a", defer=True))
    monkeypatch.setattr(mlflow_store, "write_run", _refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrackingWarning)
        logged, failed = tracking.flush_pending(store)
    assert logged == 0 and [f["job"] for f in failed] == ["job/a"]
    assert "store refused" in failed[0]["reason"] and pending.exists()
    monkeypatch.undo()
    assert tracking.flush_pending(store) == (1, [])
    assert [r.data.tags[JOB_KEY_TAG] for r in _active_runs(store)] == ["job/a"]


def _refuse(*args, **kwargs):
    raise OSError("store refused")


def test_an_unreadable_pending_file_is_reported_and_the_rest_logged(store: Path):
    _log(store, "job/a", defer=True)
    garbled = tracking.pending_dir(store) / "garbled.json"
    garbled.write_text('{"experiment": ')
    logged, failed = tracking.flush_pending(store)
    assert logged == 1 and failed[0]["job"] == str(garbled)
    assert "unreadable pending run" in failed[0]["reason"]


def test_deferring_with_tracking_off_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GRADINV_TRACKING", "off")
    assert _log(tmp_path, "job/off", defer=True) is None
    assert not tracking.pending_dir(tmp_path).exists()
    assert tracking.flush_pending(tmp_path) == (0, [])
    assert not (tmp_path / "mlflow.db").exists()


def test_a_deferred_run_carries_its_jobs_own_start_and_end_times(store: Path):
    """Logged when the workflow ends, a run still shows when its job ran and how long it took,
    not the flush's instant (every run used to last ~100 ms)."""
    import time

    started = time.time() - 120.0  # the job began two minutes ago
    path = _log(store, "job/timed", started=started, defer=True)
    ended = time.time()
    assert path and Path(path).is_file()
    time.sleep(0.5)
    assert tracking.flush_pending(store) == (1, [])
    (run,) = _active_runs(store)
    assert run.info.start_time == int(started * 1000)
    assert int(started * 1000) + 119_000 < run.info.end_time <= int(ended * 1000) + 1
    metric = _client(store).get_metric_history(run.info.run_id, "m")[0]
    assert metric.timestamp == run.info.end_time  # logged when the job ended


def test_a_final_value_is_the_last_point_of_its_history_not_a_point_at_step_0(store: Path):
    history = {"accuracy": [(r, 0.1 * r) for r in range(1, 6)]}
    _log(store, "job/curve", metrics={"accuracy": 0.5, "psnr": 12.0}, history=history)
    (run,) = _active_runs(store)
    points = _client(store).get_metric_history(run.info.run_id, "accuracy")
    assert sorted(p.step for p in points) == [1, 2, 3, 4, 5]  # no point at step 0
    assert run.data.metrics == {"accuracy": 0.5, "psnr": 12.0}
    # a final value that differs from the history's last point is a metric of its own
    _log(store, "job/curve", metrics={"accuracy": 0.45}, history=history)
    (run,) = _active_runs(store)
    points = _client(store).get_metric_history(run.info.run_id, "accuracy")
    assert min(p.step for p in points) == 1
    assert run.data.metrics == {"accuracy": 0.5, "accuracy/final": 0.45}


def test_the_experiment_opens_in_the_model_training_view(store: Path):
    _log(store, "job/kind")
    experiment = _client(store).get_experiment_by_name(EXP)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_an_attack_run_has_one_side_by_side_image_drawn_pixel_for_pixel():
    from gradinv.mlflow_run import side_by_side

    original = np.zeros((3, 8, 8))
    reconstruction = np.ones((1, 8, 8)) * 0.5  # grey beside colour
    pair = side_by_side(original, reconstruction, scale=4)
    assert pair.shape == (32, (8 + 2 + 8) * 4, 3)
    assert (pair[:, :32] == 0).all() and (pair[:, 40:] == 128 / 255).all()
    assert (pair[:, 32:40] == 1).all()  # the white gap between them
    grey = side_by_side(np.zeros((1, 8, 8)), np.ones((1, 8, 8)), scale=1)  # MNIST-like: grey
    assert grey.shape == (8, 18, 3) and (grey[:, 10:] == 1).all()
