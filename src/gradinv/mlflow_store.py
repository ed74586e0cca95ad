"""The write path of :mod:`gradinv.tracking`: one job's run (:class:`gradinv.mlflow_run.Run`,
prepared without MLflow) written into an MLflow store.

* One writer at a time: ``fcntl.flock`` on ``<db>.lock`` (SQLite allows one writer, and
  concurrent first-time schema migrations corrupt each other, mlflow#4123), polled so that a
  stuck holder costs a warning, not a hung job; retried with backoff while SQLite reports a lock.
* A run replaces the runs of its job key (the tag ``gradinv.job_key``), so a rerun never
  duplicates; a partial run is marked FAILED and replaced by the next attempt.
* Within MLflow's batch sizes; the keys and values are made valid by
  :class:`gradinv.mlflow_run.Payload` before the lock is taken.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradinv.mlflow_run import JOB_KEY_TAG, Payload, Run, mlflow_key

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

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


class TrackingWarning(UserWarning):
    """Tracking did not (fully) happen; the science result itself is unaffected."""


def warn(message: str) -> None:
    warnings.warn(message, TrackingWarning, stacklevel=3)


def sqlite_path(uri: str) -> Path | None:
    """The database file behind a ``sqlite:///`` URI, or None (server, memory, other DB)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].partition("?")[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


# ---------------------------------------------------------------------------------------------
# Locking, retries, client
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold ``<db>.lock`` exclusively, so only one process of this project writes at a time.

    Polls instead of blocking forever: a stuck holder must cost a warning, not a hung job.
    Non-sqlite stores (a tracking server) serialise writes themselves and need no lock.
    """
    db = sqlite_path(uri)
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


def with_store(uri: str, action: Any) -> Any:
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


def prepare_environment() -> None:
    """Before mlflow is imported: no telemetry thread, and no inherited run to resume."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    leaked = os.environ.pop("MLFLOW_RUN_ID", None)
    if leaked:
        log.info("ignored MLFLOW_RUN_ID=%s: each job logs its own run", leaked)


def _client(uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def mlflow_limits() -> dict[str, int]:
    try:
        from mlflow.utils import validation
    except ImportError:
        return dict(_LIMITS)
    return {name: int(getattr(validation, name, default)) for name, default in _LIMITS.items()}


# MLflow 3's UI opens an experiment in the view its kind names; without it, it guesses (and
# shows runs without traces in its GenAI view). These runs are model training and evaluation.
EXPERIMENT_KIND = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


def experiment_id(client: MlflowClient, experiment: str, location: str) -> str:
    """Get or create ``experiment`` (restoring it if deleted); caller holds the store lock."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return client.create_experiment(
            experiment, artifact_location=location, tags={EXPERIMENT_KIND: MODEL_TRAINING}
        )
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    if found.tags.get(EXPERIMENT_KIND) != MODEL_TRAINING:  # a store made before the tag
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    return found.experiment_id


def write_run(
    client: MlflowClient, location: str, run: Run, payload: Payload, limits: dict[str, int]
) -> str:
    """The write burst, under the store lock: replace old runs of ``job_key``, log, finish."""
    from mlflow.entities import Metric, Param, RunTag, ViewType

    exp_id = experiment_id(client, run.experiment, location)
    for old in _runs_with_key(client, exp_id, run.job_key, ViewType.ACTIVE_ONLY):
        client.delete_run(old)
    created = client.create_run(
        exp_id,
        run_name=run.run_name,
        tags={JOB_KEY_TAG: run.job_key},
        start_time=run.start_time,  # the job's, not this write's (a deferred run is written late)
    )
    run_id = created.info.run_id
    errors = list(run.errors)
    try:
        now = run.end_time or int(time.time() * 1000)
        metrics = [Metric(k, v, now, s) for k, v, s in payload.metrics]
        params = [Param(k, v) for k, v in payload.params.items()]
        n_pt, n_m = limits["MAX_PARAMS_TAGS_PER_BATCH"], limits["MAX_METRICS_PER_BATCH"]
        for chunk in _chunks(params, n_pt):
            client.log_batch(run_id, params=chunk)
        for chunk in _chunks(metrics, n_m):
            client.log_batch(run_id, metrics=chunk)
        for name, png in run.images.items():
            client.log_image(run_id, png, artifact_file=f"images/{mlflow_key(name, 200)}.png")
        for name, path in run.artifacts.items():
            path = Path(path)
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=mlflow_key(name, 200))
            elif path.is_file():
                client.log_artifact(run_id, str(path), artifact_path=mlflow_key(name, 200))
            else:
                errors.append(f"artifact {name}: {path} does not exist")
        tags = dict(payload.tags)
        if errors:
            tags["gradinv.tracking_errors"] = "; ".join(errors)[: limits["MAX_TAG_VAL_LENGTH"]]
            warn(f"MLflow run {run.run_name!r} ({run.job_key}) is incomplete: {'; '.join(errors)}")
        for chunk in _chunks([RunTag(k, v) for k, v in tags.items()], n_pt):
            client.log_batch(run_id, tags=chunk)
        client.set_terminated(run_id, status=run.status, end_time=run.end_time)
    except BaseException:
        # The job_key tag is already set, so the next attempt (a retry or a rerun) deletes this
        # partial run; meanwhile it is visibly FAILED rather than looking complete.
        with contextlib.suppress(Exception):
            client.set_terminated(run_id, status="FAILED")
        raise
    return run_id


def write(uri: str, location: str, run: Run) -> str:
    """Log ``run`` to the store at ``uri`` (artifacts under ``location``); its id. Raises."""
    limits = mlflow_limits()
    payload = Payload.build(run, limits)  # converted before the lock is taken
    return with_store(uri, lambda client: write_run(client, location, run, payload, limits))


def ensure_experiment(uri: str, experiment: str, location: str) -> str:
    """Create the store's schema and ``experiment`` (restored if deleted); its id. Raises."""
    return with_store(uri, lambda client: experiment_id(client, experiment, location))


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


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
