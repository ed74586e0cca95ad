"""Read the per-run metrics files that every table and figure is rendered from.

Results are data: each attack job writes one flat JSON file, and a table is a
pure function of those files. This module is the only place that reads them, so a malformed or
edited file (each carries a sha256 of its content, :func:`gradinv.io.read_json`) fails here, by
name, instead of turning into a quietly wrong average three steps later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.io import CorruptFileError, read_json, regenerate_hint

#: One job = one value of these keys; two files with the same values are a pipeline bug.
JOB_KEYS: tuple[str, ...] = (
    "dataset",
    "model",
    "defense",
    "attack",
    "round",
    "batch_size",
    "victim",
)
#: The columns of a table's per-victim values (``<table>_victims.csv``) before its metrics, and of
#: its training values seed by seed (``<table>_training.csv``) before accuracy and PMM: what a
#: claim on the table can compare, group and select on (:mod:`gradinv.claims`).
VICTIM_COLUMNS: tuple[str, ...] = (*JOB_KEYS, "attack_label", "status")
SEED_COLUMNS: tuple[str, ...] = ("dataset", "model", "defense", "seed")
#: Keys every metrics file must carry (values may be null where the schema allows).
REQUIRED_KEYS: tuple[str, ...] = (
    *JOB_KEYS,
    "dataset_label",
    "paper_dataset",
    "defense_label",
    "attack_label",
    "status",
    "failure",
    "scale",
)
DEFAULT_METRICS: tuple[str, ...] = ("mse", "lpips", "psnr", "ssim")
# not_scored: the run had nothing to measure (a defense that protects some samples only, DCS²,
# protected none of this batch); counted apart from both.
STATUSES: tuple[str, ...] = ("ok", "failed", "not_scored")


class MetricsFileError(CorruptFileError, ValueError):
    """A metrics file that cannot be tabled; the message names the file and what is wrong."""


def unavailable_column(metric: str) -> str:
    """Name of the boolean column that marks a null (unavailable) metric value.

    Metric columns are floats, where pandas would read a JSON ``null`` and a computed NaN alike.
    The two mean different things (a metric we could not compute vs. a run that blew up), so the
    null-ness is kept in its own column.
    """
    return f"{metric}_unavailable"


def floor_column(metric: str) -> str:
    """The column of the floor's value of ``metric`` on the same victim (NaN: not scored)."""
    return f"floor_{metric}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_record(path: Path, record: Any, metrics: Sequence[str]) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise MetricsFileError(
            f"{path}: expected a JSON object, found {type(record).__name__}.{regenerate_hint(path)}"
        )
    missing = [k for k in (*REQUIRED_KEYS, *metrics) if k not in record]
    if missing:
        raise MetricsFileError(
            f"{path}: missing key(s) {', '.join(missing)}.{regenerate_hint(path)}"
        )
    if record["status"] not in STATUSES:
        raise MetricsFileError(
            f"{path}: status {record['status']!r} is not one of {', '.join(STATUSES)}."
            f"{regenerate_hint(path)}"
        )
    for metric in metrics:
        value = record[metric]
        if value is not None and not _is_number(value):
            raise MetricsFileError(
                f"{path}: metric {metric!r} is {value!r}, not a number/null.{regenerate_hint(path)}"
            )
    return record


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of one score file: a cell's (``{"runs": [one record per victim]}``, what the
    score stage writes) or a single flat record."""
    try:
        data = read_json(path)  # checks the digest the score stage wrote with it
    except CorruptFileError as err:
        raise MetricsFileError(str(err)) from err
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return data["runs"]
    return [data]


def scored_runs(paths: Iterable[str | os.PathLike[str]]) -> Iterable[dict[str, Any]]:
    """Every record of the score files ``paths``, in order."""
    for path in paths:
        yield from read_records(Path(path))


def collect(
    paths: Iterable[str | os.PathLike[str]], *, metrics: Sequence[str] = DEFAULT_METRICS
) -> pd.DataFrame:
    """Read metrics files into one DataFrame, one row per job, sorted by the job keys.

    Sorting makes every aggregate independent of the order the workflow lists the files in, which
    is what keeps re-rendered tables byte-identical. Each row keeps its ``source`` path so an odd
    number can be traced to its file. For each metric ``m`` a boolean ``m_unavailable`` column
    says whether the file held ``null`` (the metric could not be computed) as opposed to a number,
    possibly NaN/inf in a failed run. ``floor_<m>`` is the floor's value of ``m`` on the same
    victim (:func:`floor_column`; NaN in a file scored without one).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise MetricsFileError("no metrics files given: a table of nothing is a workflow bug.")
    records = []
    seen: dict[tuple[Any, ...], Path] = {}
    for path, record in ((p, r) for p in paths for r in read_records(p)):
        record = _check_record(path, record, metrics)
        job = tuple(record[k] for k in JOB_KEYS)
        if job in seen:
            raise MetricsFileError(
                f"{path} and {seen[job]} describe the same job "
                f"({', '.join(f'{k}={v}' for k, v in zip(JOB_KEYS, job, strict=True))})."
            )
        seen[job] = path
        row = dict(record)
        floor = record.get("floor") or {}  # the floor's values (gradinv.stages.floor)
        for metric in metrics:
            value = record[metric]
            row[unavailable_column(metric)] = value is None
            row[metric] = math.nan if value is None else float(value)
            below = floor.get(metric)
            row[floor_column(metric)] = math.nan if not _is_number(below) else float(below)
        row["source"] = f"{path}#victim{record['victim']}"
        records.append(row)
    df = pd.DataFrame.from_records(records)
    return df.sort_values(list(JOB_KEYS), kind="stable", ignore_index=True)
