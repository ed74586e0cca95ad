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
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = [
    "TrackingWarning",
    "artifact_root",
    "flush_pending",
    "init_store",
    "log_run",
    "mlflow_ui_command",
    "pending_dir",
    "provenance",
    "tracking_enabled",
    "tracking_uri",
]

log = logging.getLogger(__name__)

JOB_KEY_TAG = "gradinv.job_key"
_ENV_URI = "GRADINV_TRACKING_URI"
_ENV_ARTIFACTS = "GRADINV_ARTIFACT_ROOT"
_ENV_SWITCH = "GRADINV_TRACKING"
_OFF_VALUES = {"0", "off", "false", "no", "disabled"}

# MLflow's limits (mlflow.utils.validation); read from mlflow when it is importable, these are
# the values of MLflow 3.x and only a fallback.
_LIMITS = {
    "MAX_PARAMS_TAGS_PER_BATCH": 100,
    "MAX_METRICS_PER_BATCH": 1000,
    "MAX_PARAM_VAL_LENGTH": 6000,
    "MAX_TAG_VAL_LENGTH": 8000,
    "MAX_ENTITY_KEY_LENGTH": 250,
}
_LOCK_TIMEOUT_S = 600.0
_RETRIES = 6
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


class TrackingWarning(UserWarning):
    """Tracking did not (fully) happen; the science result itself is unaffected."""


def _warn(message: str) -> None:
    warnings.warn(message, TrackingWarning, stacklevel=3)


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
    db = _sqlite_path(uri)
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
    db = _sqlite_path(tracking_uri(project_root))
    base = db.parent if db is not None else Path(project_root).resolve()
    return str(base / "mlartifacts")


def pending_dir(project_root: Path) -> Path:
    """Where deferred runs wait for :func:`flush_pending`: ``<db>.pending`` beside a SQLite store
    (so a test's or a scratch store's runs never mix with the project's), else
    ``<project root>/mlflow-pending``."""
    db = _sqlite_path(tracking_uri(project_root))
    if db is not None:
        return db.with_name(db.name + ".pending")
    return Path(project_root).resolve() / "mlflow-pending"


def mlflow_ui_command(project_root: Path) -> str:
    """The exact command that browses this project's runs (for the README)."""
    return f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri(project_root))} --port 5000"


def tracking_enabled(enabled: bool = True) -> bool:
    """Whether to track at all: ``enabled`` flag, ``GRADINV_TRACKING=off`` and mlflow present."""
    if not enabled or os.environ.get(_ENV_SWITCH, "").strip().lower() in _OFF_VALUES:
        return False
    if importlib.util.find_spec("mlflow") is None:
        log.info("mlflow is not installed; runs are not mirrored to MLflow")
        return False
    return True


def _sqlite_path(uri: str) -> Path | None:
    """The database file behind a ``sqlite:///`` URI, or None (server, memory, other DB)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].partition("?")[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


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


# ---------------------------------------------------------------------------------------------
# Locking, retries, client
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold ``<db>.lock`` exclusively, so only one process of this project writes at a time.

    Polls instead of blocking forever: a stuck holder must cost a warning, not a hung job.
    Non-sqlite stores (a tracking server) serialise writes themselves and need no lock.
    """
    db = _sqlite_path(uri)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; rely on SQLite's busy timeout and our retries
        fcntl = None  # type: ignore[assignment]
    if db is None or fcntl is None:
        yield
        return
    with open(f"{db}.lock", "a+") as handle:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {_LOCK_TIMEOUT_S:.0f} s for {db}.lock") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _is_transient(exc: BaseException) -> bool:
    """A 'database is locked/busy' error somewhere in the chain: worth another try."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).lower()
        operational = "operationalerror" in f"{type(e).__name__.lower()} {text}"
        if (operational and ("locked" in text or "busy" in text)) or "database is locked" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def _with_store(uri: str, action: Any) -> Any:
    """Run ``action(client)`` under the store lock, retrying transient SQLite lock errors."""
    _import_outside_lock(uri)
    for attempt in range(_RETRIES):
        try:
            with _store_lock(uri):
                return action(_client(uri))
        except Exception as exc:
            if attempt + 1 == _RETRIES or not _is_transient(exc):
                raise
            delay = min(0.2 * 2**attempt, 5.0)
            log.info("tracking store busy (%s); retrying in %.1f s", exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _import_outside_lock(uri: str) -> None:
    """Import MLflow's store modules before taking the lock.

    The SQL store's first use imports SQLAlchemy and alembic (seconds); done under the lock,
    parallel jobs would wait for each other's imports, not just for their short writes.
    """
    import mlflow.entities
    import mlflow.tracking

    if uri.startswith("sqlite:"):
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def _prepare_environment() -> None:
    """Before mlflow is imported: no telemetry thread, and no inherited run to resume."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    leaked = os.environ.pop("MLFLOW_RUN_ID", None)
    if leaked:
        log.info("ignored MLFLOW_RUN_ID=%s: each job logs its own run", leaked)


def _client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _limits() -> dict[str, int]:
    try:
        from mlflow.utils import validation
    except ImportError:
        return dict(_LIMITS)
    return {name: int(getattr(validation, name, default)) for name, default in _LIMITS.items()}


def _experiment_id(client: MlflowClient, experiment: str, location: str) -> str:
    """Get or create ``experiment`` (restoring it if deleted); caller holds the store lock."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return client.create_experiment(experiment, artifact_location=location)
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


def _artifact_location(project_root: Path) -> str:
    root = artifact_root(project_root)
    return root if "://" in root else Path(root).as_uri()


# ---------------------------------------------------------------------------------------------
# Public API: init_store, log_run
# ---------------------------------------------------------------------------------------------


def init_store(project_root: Path, experiment: str, *, enabled: bool = True) -> None:
    """Create the schema and ``experiment`` once, before Snakemake fans out (its ``onstart``).

    Idempotent and safe when two processes call it together (the store lock serialises the
    first schema migration, which MLflow does not protect). Never raises: a failure is a
    :class:`TrackingWarning`, and ``log_run`` would try again per job anyway.
    """
    if not tracking_enabled(enabled):
        return
    _prepare_environment()
    uri = "<unresolved>"
    try:
        uri = tracking_uri(project_root)
        location = _artifact_location(project_root)
        _with_store(uri, lambda client: _experiment_id(client, experiment, location))
    except Exception as exc:
        _warn(f"MLflow store {uri} could not be initialised: {type(exc).__name__}: {exc}")


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

    Never raises: any failure becomes a :class:`TrackingWarning` and the return value None.
    Problems with single items (an unreadable image, a missing artifact) are warned about and
    named in the tag ``gradinv.tracking_errors`` of an otherwise complete run.
    """
    if not tracking_enabled(enabled):
        return None
    _prepare_environment()
    run = _Run.of(
        experiment=experiment,
        run_name=run_name,
        job_key=job_key,
        params=params,
        metrics=metrics,
        history=history or {},
        tags=tags or {},
        artifacts=artifacts or {},
        images=images or {},
        status=status,
        project_root=project_root,
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
    _prepare_environment()
    logged, failed = 0, []
    for path in files:
        try:
            run = _Run.from_json(json.loads(path.read_text()))
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


def _log_now(run: _Run, project_root: Path) -> str | None:
    uri = "<unresolved>"
    try:
        uri = tracking_uri(project_root)
        limits = _limits()
        payload = _Payload.build(run, limits)
        location = _artifact_location(project_root)
        return _with_store(uri, lambda client: _write_run(client, location, run, payload, limits))
    except Exception as exc:
        _warn(
            f"MLflow run {run.run_name!r} ({run.job_key}) was not logged to {uri}: "
            f"{type(exc).__name__}: {exc}"
        )
        return None


def _defer(run: _Run, project_root: Path) -> str | None:
    from gradinv.io import write_text  # atomic; torch, which it imports, is loaded in a job

    path = pending_dir(project_root) / f"{_digest(run.job_key)}.json"
    try:
        write_text(path, json.dumps(run.to_json(), allow_nan=True))
        return str(path)
    except Exception as exc:
        _warn(
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


_UNREADABLE = object()  # a metric value that is no number


@dataclass
class _Run:
    """One job's run, prepared without MLflow: plain values, JSON-able but for the images."""

    experiment: str
    run_name: str
    job_key: str
    params: dict[str, str]  # flattened to dotted keys, values as text
    metrics: dict[str, float | None]
    history: dict[str, list[tuple[int, float]]]
    tags: dict[str, str]  # provenance included
    images: dict[str, Any]  # uint8 arrays (H,W[,C])
    artifacts: dict[str, str]  # absolute: a flush may run elsewhere
    status: str
    errors: list[str] = field(default_factory=list)  # items that could not be read

    @classmethod
    def of(
        cls,
        *,
        experiment: str,
        run_name: str,
        job_key: str,
        params: Mapping[str, Any],
        metrics: Mapping[str, Any],
        history: Mapping[str, list[tuple[int, Any]]],
        tags: Mapping[str, Any],
        artifacts: Mapping[str, Path],
        images: Mapping[str, Any],
        status: str,
        project_root: Path,
    ) -> _Run:
        errors: list[str] = []

        def number(key: Any, value: Any) -> Any:
            """The value as a float, None kept; _UNREADABLE (recorded in errors) otherwise."""
            if value is None:
                return None
            try:
                return float(value.item() if hasattr(value, "item") else value)
            except (TypeError, ValueError) as exc:
                errors.append(f"metric {key}: {exc}")
                return _UNREADABLE

        numbers = {str(k): number(k, v) for k, v in metrics.items()}
        series = {
            str(k): [(int(step), n) for step, v in pts if isinstance(n := number(k, v), float)]
            for k, pts in history.items()
        }
        pngs = {}
        for name, img in images.items():
            try:
                pngs[str(name)] = _to_uint8_image(img)
            except (TypeError, ValueError) as exc:
                errors.append(f"image {name}: {exc}")
        return cls(
            experiment=experiment,
            run_name=run_name,
            job_key=job_key,
            params={k: _text(v) for k, v in _flatten(params).items()},
            metrics={k: v for k, v in numbers.items() if v is not _UNREADABLE},
            history=series,
            tags={
                **{f"gradinv.{k}": v for k, v in provenance(project_root).items()},
                **{str(k): _text(v) for k, v in tags.items()},
            },
            images=pngs,
            artifacts={str(k): str(Path(v).absolute()) for k, v in artifacts.items()},
            status=status,
            errors=errors,
        )

    def to_json(self) -> dict[str, Any]:
        record = dict(vars(self))
        record["images"] = {
            k: {"shape": list(a.shape), "data": a.ravel().tolist()} for k, a in self.images.items()
        }
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> _Run:
        import numpy as np

        images = {
            k: np.asarray(v["data"], dtype=np.uint8).reshape(v["shape"])
            for k, v in record["images"].items()
        }
        history = {k: [(int(s), float(v)) for s, v in pts] for k, pts in record["history"].items()}
        return cls(**{**record, "images": images, "history": history})


class _Payload:
    """Params, metrics and tags converted to MLflow entities before the lock is taken."""

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.metrics: list[tuple[str, float, int]] = []
        self.tags: dict[str, str] = {}

    @classmethod
    def build(cls, run: _Run, limits: dict[str, int]) -> _Payload:
        self = cls()
        key_len = limits["MAX_ENTITY_KEY_LENGTH"]
        val_len = limits["MAX_PARAM_VAL_LENGTH"]
        for key, value in run.params.items():
            self.params[_key(key, key_len)] = value[:val_len]
        none, nonfinite = [], []
        for key, number in run.metrics.items():
            if number is None:
                none.append(key)
                continue
            if not math.isfinite(number):
                nonfinite.append(f"{key}={number}")
            self.metrics.append((_key(key, key_len), number, 0))
        for key, series in run.history.items():
            bad = 0
            for step, number in series:
                bad += not math.isfinite(number)
                self.metrics.append((_key(key, key_len), number, step))
            if bad:
                nonfinite.append(f"{key}[history]: {bad} non-finite")
        self.tags = {_key(k, key_len): v for k, v in run.tags.items()}
        self.tags[JOB_KEY_TAG] = run.job_key
        if none:
            self.tags["gradinv.metrics_none"] = ", ".join(none)
        if nonfinite:
            self.tags["gradinv.metrics_nonfinite"] = ", ".join(nonfinite)
        tag_len = limits["MAX_TAG_VAL_LENGTH"]
        self.tags = {k: v[:tag_len] for k, v in self.tags.items()}
        return self


def _write_run(
    client: MlflowClient, location: str, run: _Run, payload: _Payload, limits: dict[str, int]
) -> str:
    """The write burst, under the store lock: replace old runs of ``job_key``, log, finish."""
    from mlflow.entities import Metric, Param, RunTag, ViewType

    exp_id = _experiment_id(client, run.experiment, location)
    for old in _runs_with_key(client, exp_id, run.job_key, ViewType.ACTIVE_ONLY):
        client.delete_run(old)
    created = client.create_run(exp_id, run_name=run.run_name, tags={JOB_KEY_TAG: run.job_key})
    run_id = created.info.run_id
    errors = list(run.errors)
    try:
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, s) for k, v, s in payload.metrics]
        params = [Param(k, v) for k, v in payload.params.items()]
        n_pt, n_m = limits["MAX_PARAMS_TAGS_PER_BATCH"], limits["MAX_METRICS_PER_BATCH"]
        for chunk in _chunks(params, n_pt):
            client.log_batch(run_id, params=chunk)
        for chunk in _chunks(metrics, n_m):
            client.log_batch(run_id, metrics=chunk)
        for name, png in run.images.items():
            client.log_image(run_id, png, artifact_file=f"images/{_key(name, 200)}.png")
        for name, path in run.artifacts.items():
            path = Path(path)
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=_key(name, 200))
            elif path.is_file():
                client.log_artifact(run_id, str(path), artifact_path=_key(name, 200))
            else:
                errors.append(f"artifact {name}: {path} does not exist")
        tags = dict(payload.tags)
        if errors:
            tags["gradinv.tracking_errors"] = "; ".join(errors)[: limits["MAX_TAG_VAL_LENGTH"]]
            _warn(f"MLflow run {run.run_name!r} ({run.job_key}) is incomplete: {'; '.join(errors)}")
        for chunk in _chunks([RunTag(k, v) for k, v in tags.items()], n_pt):
            client.log_batch(run_id, tags=chunk)
        client.set_terminated(run_id, status=run.status)
    except BaseException:
        # The job_key tag is already set, so the next attempt (a retry or a rerun) deletes this
        # partial run; meanwhile it is visibly FAILED rather than looking complete.
        with contextlib.suppress(Exception):
            client.set_terminated(run_id, status="FAILED")
        raise
    return run_id


def _runs_with_key(client: MlflowClient, exp_id: str, job_key: str, view: Any) -> list[str]:
    """Ids of runs tagged with ``job_key`` (paged; quoting chosen so any key is searchable)."""
    if "'" not in job_key:
        flt = f"tags.`{JOB_KEY_TAG}` = '{job_key}'"
    elif '"' not in job_key:
        flt = f'tags.`{JOB_KEY_TAG}` = "{job_key}"'
    else:
        flt = ""  # unquotable: scan and compare in Python
    ids: list[str] = []
    token = None
    while True:
        page = client.search_runs(
            [exp_id], filter_string=flt, run_view_type=view, max_results=1000, page_token=token
        )
        ids += [r.info.run_id for r in page if r.data.tags.get(JOB_KEY_TAG) == job_key]
        token = page.token
        if not token:
            return ids


# ---------------------------------------------------------------------------------------------
# Small conversions
# ---------------------------------------------------------------------------------------------


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted keys, the way params.yaml sections read."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _key(key: str, limit: int) -> str:
    """An MLflow-valid name: allowed characters only, no path tricks, within the length limit."""
    clean = _BAD_KEY_CHARS.sub("_", key).strip("/") or "_"
    clean = re.sub(r"/+", "/", clean)
    clean = "/".join("_" if part in (".", "..") else part for part in clean.split("/"))
    return clean[:limit]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _to_uint8_image(image: Any) -> Any:
    """An (H,W,C)/(C,H,W)/(H,W) array or tensor in [0,1] as an (H,W[,C]) uint8 array.

    Converted here rather than by MLflow so that channel-first tensors (torch's layout) work,
    and out-of-range values are clipped instead of failing the whole run.
    """
    import numpy as np

    if hasattr(image, "detach"):  # torch tensor, without importing torch here
        image = image.detach().to("cpu").float().numpy()
    array = np.asarray(image, dtype=np.float64)
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = np.transpose(array, (1, 2, 0))
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)):
        raise ValueError(f"image must be (H,W,C), (C,H,W) or (H,W); got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("image contains NaN or inf")
    return np.round(np.clip(array, 0.0, 1.0) * 255.0).astype(np.uint8)
