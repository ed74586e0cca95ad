"""The write path of :mod:`gradinv.tracking`: one job's run, prepared without MLflow, written
into an MLflow store.

* One writer at a time: ``fcntl.flock`` on ``<db>.lock`` (SQLite allows one writer, and
  concurrent first-time schema migrations corrupt each other, mlflow#4123), polled so that a
  stuck holder costs a warning, not a hung job; retried with backoff while SQLite reports a lock.
* A run replaces the runs of its job key (the tag ``gradinv.job_key``), so a rerun never
  duplicates; a partial run is marked FAILED and replaced by the next attempt.
* Within MLflow's limits (key characters and lengths, values, batch sizes); images converted
  here, so channel-first tensors work and out-of-range values are clipped.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

JOB_KEY_TAG = "gradinv.job_key"

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


def experiment_id(client: MlflowClient, experiment: str, location: str) -> str:
    """Get or create ``experiment`` (restoring it if deleted); caller holds the store lock."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return client.create_experiment(experiment, artifact_location=location)
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


_UNREADABLE = object()  # a metric value that is no number


@dataclass
class Run:
    """One job's run, prepared without MLflow: plain values, JSON-able but for the images
    (:meth:`to_json` and :meth:`from_json` carry it through a pending file)."""

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
    ) -> Run:
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
            tags={str(k): _text(v) for k, v in tags.items()},
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
    def from_json(cls, record: dict[str, Any]) -> Run:
        import numpy as np

        images = {
            k: np.asarray(v["data"], dtype=np.uint8).reshape(v["shape"])
            for k, v in record["images"].items()
        }
        history = {k: [(int(s), float(v)) for s, v in pts] for k, pts in record["history"].items()}
        return cls(**{**record, "images": images, "history": history})


class Payload:
    """Params, metrics and tags converted to MLflow entities before the lock is taken."""

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.metrics: list[tuple[str, float, int]] = []
        self.tags: dict[str, str] = {}

    @classmethod
    def build(cls, run: Run, limits: dict[str, int]) -> Payload:
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


def write_run(
    client: MlflowClient, location: str, run: Run, payload: Payload, limits: dict[str, int]
) -> str:
    """The write burst, under the store lock: replace old runs of ``job_key``, log, finish."""
    from mlflow.entities import Metric, Param, RunTag, ViewType

    exp_id = experiment_id(client, run.experiment, location)
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
            warn(f"MLflow run {run.run_name!r} ({run.job_key}) is incomplete: {'; '.join(errors)}")
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
