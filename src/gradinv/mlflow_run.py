"""One job's MLflow run as plain values, prepared without MLflow (:class:`Run`), and as the
params, metrics and tags MLflow takes (:class:`Payload`), within MLflow's limits on key
characters, lengths and values. Images are converted here, so channel-first tensors work and
out-of-range values are clipped. :mod:`gradinv.mlflow_store` writes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB_KEY_TAG = "gradinv.job_key"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")

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
    # the job's own start and end (ms since the epoch), whenever the run is written to MLflow
    start_time: int | None = None
    end_time: int | None = None

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
        start_time: float | None = None,
        end_time: float | None = None,
    ) -> Run:
        """``start_time`` and ``end_time`` in seconds since the epoch (``time.time()``)."""
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
            start_time=None if start_time is None else int(start_time * 1000),
            end_time=None if end_time is None else int(end_time * 1000),
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
            self.params[mlflow_key(key, key_len)] = value[:val_len]
        none, nonfinite = [], []
        for key, number in run.metrics.items():
            if number is None:
                none.append(key)
                continue
            if not math.isfinite(number):
                nonfinite.append(f"{key}={number}")
            # A final value with a history is that history's last point, logged there already;
            # one that differs is a metric of its own: never a point at step 0 of the curve.
            series = run.history.get(key)
            if series and series[-1][1] == number:
                continue
            name = f"{key}/final" if series else key
            self.metrics.append((mlflow_key(name, key_len), number, 0))
        for key, series in run.history.items():
            bad = 0
            for step, number in series:
                bad += not math.isfinite(number)
                self.metrics.append((mlflow_key(key, key_len), number, step))
            if bad:
                nonfinite.append(f"{key}[history]: {bad} non-finite")
        self.tags = {mlflow_key(k, key_len): v for k, v in run.tags.items()}
        self.tags[JOB_KEY_TAG] = run.job_key
        if none:
            self.tags["gradinv.metrics_none"] = ", ".join(none)
        if nonfinite:
            self.tags["gradinv.metrics_nonfinite"] = ", ".join(nonfinite)
        tag_len = limits["MAX_TAG_VAL_LENGTH"]
        self.tags = {k: v[:tag_len] for k, v in self.tags.items()}
        return self


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


def mlflow_key(key: str, limit: int) -> str:
    """An MLflow-valid name: allowed characters only, no path tricks, within the length limit."""
    clean = _BAD_KEY_CHARS.sub("_", key).strip("/") or "_"
    clean = re.sub(r"/+", "/", clean)
    clean = "/".join("_" if part in (".", "..") else part for part in clean.split("/"))
    return clean[:limit]


def side_by_side(original: Any, reconstruction: Any, *, scale: int = 4) -> Any:
    """One picture of ``original`` | ``reconstruction`` (a white gap between), each pixel drawn
    as ``scale`` x ``scale`` (no smoothing: a 32x32 image stays readable in the UI), in [0, 1]."""
    import numpy as np

    def colour(image: Any) -> Any:  # (H, W, 3) in [0, 1]: a grey image drawn in colour
        array = _to_uint8_image(image).astype(np.float64) / 255.0
        return array[..., :3] if array.ndim == 3 else np.repeat(array[..., None], 3, axis=2)

    left, right = colour(original), colour(reconstruction)
    gap = np.ones((left.shape[0], 2, 3))
    pair = np.concatenate([left, gap, right], axis=1)
    return np.repeat(np.repeat(pair, scale, axis=0), scale, axis=1)


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
