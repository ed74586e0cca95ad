"""Mirror finished pipeline jobs into MLflow, for browsing only.

Why this module exists and what it promises:

* **MLflow never decides a number.** Every job writes its own flat metrics file and the tables
  are built from those files alone. MLflow is a window onto them (``mlflow ui``), so a tracking
  failure must never fail the science job: it is reported as a :class:`TrackingWarning`, the
  functions return ``None``, and the caller records that in its metrics file.
* **One store, at an absolute path.** Snakemake shadow dirs, ``--directory``, ``dvc exp run
  --temp`` and pytest's ``tmp_path`` all change the working directory, and MLflow resolves a
  relative ``sqlite:///mlflow.db`` against it. So the store is ``<project root>/mlflow.db`` with
  artifacts in ``<project root>/mlartifacts`` (overridable by ``GRADINV_TRACKING_URI`` and
  ``GRADINV_ARTIFACT_ROOT``), and the experiment is created with an explicit artifact location.
* **Parallel jobs, one SQLite writer.** Snakemake runs jobs as separate processes and SQLite
  allows one writer at a time; concurrent first-time schema migrations even corrupt each other
  ("duplicate column", mlflow#4123). Each job therefore logs ONE run at its end in a short
  burst of batched calls, serialised across processes by ``fcntl.flock`` on ``<db>.lock``, and
  retried with backoff if SQLite still reports a lock (another tool, e.g. ``mlflow ui``).
* **Exactly once per job.** A job rerun after an interruption must not leave two runs: every run
  carries the tag ``gradinv.job_key`` and older runs with the same key are deleted first.
* **No leaked run.** ``MLFLOW_RUN_ID`` in the environment makes MLflow resume that run, so one
  leaked id would funnel every job into one run; it is removed and only ``MlflowClient`` (which
  takes explicit run ids) is used.
* **Cheap when off.** ``import mlflow`` costs seconds, so it happens only inside these functions;
  with ``GRADINV_TRACKING=off``, ``enabled=False`` or mlflow not installed, nothing is written.
* **Cheap when deferred.** That import (and SQLAlchemy's) is about 4 s of every job's wall time,
  more than a score job's own work. ``log_run(defer=True)`` writes the run to a pending folder
  instead (one JSON file per job key, atomically, without importing MLflow) and
  :func:`flush_pending` logs every pending run in one process, with one import, when the
  workflow ends. The run in MLflow is the same either way; a rerun before the flush replaces its
  pending file.

This module is the API and the policy. A job's run, as plain values and within MLflow's limits,
is :mod:`gradinv.mlflow_run`; the write path (the lock, the retries, one run replacing its job
key's) is :mod:`gradinv.mlflow_store`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import gradinv
from gradinv import mlflow_store as store
from gradinv.mlflow_run import JOB_KEY_TAG, Run
from gradinv.mlflow_store import TrackingWarning

__all__ = [
    "JOB_KEY_TAG",
    "TrackingWarning",
    "artifact_root",
    "flush_pending",
    "init_store",
    "log_run",
    "mlflow_ui_command",
    "mlflow_ui_url",
    "pending_dir",
    "provenance",
    "tracking_enabled",
    "tracking_uri",
]

log = logging.getLogger(__name__)

_ENV_URI = "GRADINV_TRACKING_URI"
_ENV_ARTIFACTS = "GRADINV_ARTIFACT_ROOT"
_ENV_SWITCH = "GRADINV_TRACKING"
_OFF_VALUES = {"0", "off", "false", "no", "disabled"}


# ---------------------------------------------------------------------------------------------
# Where the store lives
# ---------------------------------------------------------------------------------------------


def tracking_uri(project_root: Path) -> str:
    """The store's URI: ``GRADINV_TRACKING_URI`` or ``sqlite:////<abs project root>/mlflow.db``.

    A relative sqlite path in the override is made absolute against ``project_root``, because
    MLflow would resolve it against whatever the job's working directory happens to be.
    """
    uri = os.environ.get(_ENV_URI, "").strip()
    if not uri:
        return "sqlite:///" + str(Path(project_root).resolve() / "mlflow.db")
    db = store.sqlite_path(uri)
    if db is not None and not db.is_absolute():
        query = uri.partition("?")[2]
        absolute = Path(project_root).resolve() / db
        uri = f"sqlite:///{absolute}" + (f"?{query}" if query else "")
    return uri


def artifact_root(project_root: Path) -> str:
    """Absolute directory for run artifacts: ``GRADINV_ARTIFACT_ROOT`` or ``mlartifacts`` beside
    the sqlite file (which is ``<project root>/mlartifacts`` for the default store).

    Keeping artifacts beside an overridden database means a test or a scratch store never
    writes into the project's own ``mlartifacts``.
    """
    override = os.environ.get(_ENV_ARTIFACTS, "").strip()
    if override:
        if "://" in override:
            return override
        return str((Path(project_root).resolve() / override).resolve())
    db = store.sqlite_path(tracking_uri(project_root))
    base = db.parent if db is not None else Path(project_root).resolve()
    return str(base / "mlartifacts")


def pending_dir(project_root: Path) -> Path:
    """Where deferred runs wait for :func:`flush_pending`: ``<db>.pending`` beside a SQLite store
    (so a test's or a scratch store's runs never mix with the project's), else
    ``<project root>/mlflow-pending``."""
    db = store.sqlite_path(tracking_uri(project_root))
    if db is not None:
        return db.with_name(db.name + ".pending")
    return Path(project_root).resolve() / "mlflow-pending"


def mlflow_ui_command(project_root: Path) -> str:
    """The exact command that browses this project's runs (for the documentation)."""
    return f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri(project_root))} --port 5000"


def mlflow_ui_url(port: int = 5000, experiment_id: str | None = None) -> str:
    """Where to point a browser: the experiment (or the list) in MLflow's model-training view
    (MLflow 3 opens its GenAI view unless the address asks for another)."""
    where = f"experiments/{experiment_id}" if experiment_id else "experiments"
    return f"http://127.0.0.1:{port}/#/{where}?workflowType=machine_learning"


def tracking_enabled(enabled: bool = True) -> bool:
    """Whether to track at all: ``enabled`` flag, ``GRADINV_TRACKING=off`` and mlflow present."""
    if not enabled or os.environ.get(_ENV_SWITCH, "").strip().lower() in _OFF_VALUES:
        return False
    if importlib.util.find_spec("mlflow") is None:
        log.info("mlflow is not installed; runs are not mirrored to MLflow")
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------


def _git(project_root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(project_root), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _version(dist: str) -> str:
    module = sys.modules.get(dist)
    if isinstance(getattr(module, "__version__", None), str):
        return module.__version__  # torch's carries the build, e.g. "+cu130"; metadata does not
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def provenance(project_root: Path) -> dict[str, str]:
    """What produced a result: git commit and dirty flag, Python and library versions.

    Hostname-free on purpose, so that metrics files from different machines compare equal when
    the code and environment agree. Git may be missing or the folder may not be a repository
    (a release tarball, a repo without commits): then the fields say ``"unknown"``.
    Versions come from the imported module or else package metadata: this never imports torch.
    """
    head = _git(project_root, "rev-parse", "HEAD")
    status = _git(project_root, "status", "--porcelain") if head is not None else None
    return {
        "git_commit": head.strip() if head else "unknown",
        "git_dirty": "unknown" if status is None else str(bool(status.strip())).lower(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "gradinv": _version("gradinv"),
        "platform": f"{platform.system()}-{platform.machine()}",
    }


def _artifact_location(project_root: Path) -> str:
    root = artifact_root(project_root)
    return root if "://" in root else Path(root).as_uri()


# ---------------------------------------------------------------------------------------------
# Public API: init_store, log_run, flush_pending
# ---------------------------------------------------------------------------------------------


def init_store(project_root: Path, experiment: str, *, enabled: bool = True) -> None:
    """Create the schema and ``experiment`` once, before Snakemake fans out (its ``onstart``).

    Idempotent and safe when two processes call it together (the store lock serialises the
    first schema migration, which MLflow does not protect). Never raises: a failure is a
    :class:`TrackingWarning`, and ``log_run`` would try again per job anyway.
    """
    if not tracking_enabled(enabled):
        return
    store.prepare_environment()
    uri = "<unresolved>"
    try:
        uri = tracking_uri(project_root)
        location = _artifact_location(project_root)
        store.ensure_experiment(uri, experiment, location)
    except Exception as exc:
        store.warn(f"MLflow store {uri} could not be initialised: {type(exc).__name__}: {exc}")


def log_run(
    *,
    experiment: str,
    run_name: str,
    job_key: str,
    params: Mapping[str, Any],
    metrics: Mapping[str, float | None],
    history: Mapping[str, list[tuple[int, float]]] | None = None,
    tags: Mapping[str, str] | None = None,
    artifacts: Mapping[str, Path] | None = None,
    images: Mapping[str, Any] | None = None,
    status: Literal["FINISHED", "FAILED"] = "FINISHED",
    project_root: Path,
    enabled: bool = True,
    defer: bool = False,
    started: float | None = None,
) -> str | None:
    """Mirror one finished job as one MLflow run; return its id, or None if not tracked.

    With ``defer`` the run is prepared the same way (provenance read now, images converted now:
    the job's state, not the flush's) but saved to :func:`pending_dir` as
    ``<sha256(job_key)>.json``, atomically, replacing an earlier pending run of the same job,
    for :func:`flush_pending` to log; the return value is then that file's path. This skips
    MLflow's import, about 4 s per job.

    ``job_key`` identifies the job (e.g. its output path): runs of the same key are deleted
    before the new one is written, so a rerun replaces rather than duplicates. ``params`` may
    nest (flattened to dotted keys, values cut to MLflow's length limit). ``None`` metrics are
    skipped and named in the tag ``gradinv.metrics_none``; NaN/inf are logged as MLflow stores
    them and named in ``gradinv.metrics_nonfinite`` (MLflow clamps inf to +-1.8e308, so the tag
    keeps the truth). ``history`` maps a metric to ``(step, value)`` pairs, e.g. per FL round.
    ``images`` are arrays/tensors (H,W,C), (C,H,W) or (H,W) in [0, 1], saved as PNG under
    ``images/``; ``artifacts`` map a folder name inside the run to a local file or folder.
    Provenance (:func:`provenance`) is added as ``gradinv.*`` tags unless ``tags`` override it.
    The run starts when the job did (``started``, seconds since the epoch; by default when this
    process imported gradinv) and ends now, whenever it is written (deferred or not).

    Never raises: any failure becomes a :class:`TrackingWarning` and the return value None.
    Problems with single items (an unreadable image, a missing artifact) are warned about and
    named in the tag ``gradinv.tracking_errors`` of an otherwise complete run.
    """
    if not tracking_enabled(enabled):
        return None
    store.prepare_environment()
    run = Run.of(
        experiment=experiment,
        run_name=run_name,
        job_key=job_key,
        params=params,
        metrics=metrics,
        history=history or {},
        tags={  # provenance first, so that ``tags`` may override it
            **{f"gradinv.{k}": v for k, v in provenance(project_root).items()},
            **(tags or {}),
        },
        artifacts=artifacts or {},
        images=images or {},
        status=status,
        start_time=gradinv.STARTED if started is None else started,
        end_time=time.time(),
    )
    if defer:
        return _defer(run, project_root)
    return _log_now(run, project_root)


def flush_pending(project_root: Path, *, enabled: bool = True) -> tuple[int, list[dict[str, str]]]:
    """Log every pending run (oldest first) to the store, deleting each file once it is in.

    Returns how many were logged and, for each that was not, ``{"job", "reason"}``; those
    files stay pending for the next flush. Imports MLflow only when something is pending.
    Never raises. Safe to run twice at once: a run logged twice replaces itself (its job key).
    """
    folder = pending_dir(project_root)
    files = sorted(folder.glob("*.json"), key=_mtime) if folder.is_dir() else []
    if not files or not tracking_enabled(enabled):
        return 0, []
    store.prepare_environment()
    logged, failed = 0, []
    for path in files:
        try:
            run = Run.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            continue  # another flush took it
        except (OSError, ValueError, KeyError, TypeError) as exc:
            failed.append({"job": str(path), "reason": f"unreadable pending run: {exc}"})
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_id = _log_now(run, project_root)
        for w in caught:
            if run_id is not None:  # an incomplete run: say so, as log_run would have
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if run_id is None:
            reason = "; ".join(str(w.message) for w in caught) or "unknown reason"
            failed.append({"job": run.job_key, "reason": reason})
            continue
        path.unlink(missing_ok=True)
        logged += 1
    return logged, failed


def _log_now(run: Run, project_root: Path) -> str | None:
    uri = "<unresolved>"
    try:
        uri = tracking_uri(project_root)
        return store.write(uri, _artifact_location(project_root), run)
    except Exception as exc:
        store.warn(
            f"MLflow run {run.run_name!r} ({run.job_key}) was not logged to {uri}: "
            f"{type(exc).__name__}: {exc}"
        )
        return None


def _defer(run: Run, project_root: Path) -> str | None:
    from gradinv.io import write_text  # atomic; torch, which it imports, is loaded in a job

    path = pending_dir(project_root) / f"{_digest(run.job_key)}.json"
    try:
        write_text(path, json.dumps(run.to_json(), allow_nan=True))
        return str(path)
    except Exception as exc:
        store.warn(
            f"MLflow run {run.run_name!r} ({run.job_key}) was not saved to {path.parent}: "
            f"{type(exc).__name__}: {exc}"
        )
        return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return math.inf
