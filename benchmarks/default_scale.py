"""A job's seconds at the default scale, for benchmarks/costs.py: measured, estimated or none.

Measured: the median ``s`` of the job's ``benchmark:`` file, else Snakemake's record of its
outputs (``.snakemake/metadata``). Estimated: the median of the measured jobs doing the same work
on other data, else of the same rule, method and shape. Else unmeasured: no seconds, never 0 s
(the "Default scale, measured." paragraph of costs.py's docstring).
"""

from __future__ import annotations

import base64
import csv
import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jobs import Job  # benchmarks/jobs.py, beside this script
from run_log import paused

# A job's wildcards that only pick other data for the same work (an attack job's victims first to
# last: the same work when as many, see _shape; a utility run's seed: the same training on
# another draw, so an unrun seed takes the median of its recipe, model and defense's other seeds).
INSTANCE = ("victim", "first", "last", "round", "seed")
# The wildcard naming a job's method, by rule (for the median of measured jobs).
METHOD = {
    "attack": "attack",
    "score": "attack",
    "capture": "defense",
    "capture_malicious": "defense",
    "train": "defense",
    "train_utility": "defense",
    "train_convergence": "defense",
    "train_convergence_official": "defense",
    "client_time": "defense",
    "train_generator": "generator",
}
# victims: an attack job's count; recipe: a utility run's FL recipe (its rounds, clients and local
# steps: the same defense under another recipe is other work; sparsification on the 3-layer CNN
# took about 15 s a run under the common recipe, 213 s under CVB's)
SHAPE_WILDCARDS = ("dataset", "model", "bs", "victims", "recipe")
SWEEP_BASE = "its sweep's base defense"  # a group a variant looks up, never one it joins
SWEPT = "-"  # a sweep's variant is named <defense>-<setting><value> (gradinv.sweeps.sweep_variant)
RECORD_TOLERANCE = 0.01  # s: a recorded end and the output's modification time agree to this


@dataclass(frozen=True)
class Cost:
    """A job's seconds and where they come from: ``measured``, ``estimated`` or None (none)."""

    seconds: float | None
    kind: str | None
    how: str


def benchmark_seconds(path: Path) -> float | None:
    """The median ``s`` of a Snakemake benchmark TSV; None if absent, empty or not a number."""
    if not path.is_file():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    values = []
    for row in rows:
        try:
            value = float(row["s"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            values.append(value)
    return statistics.median(values) if values else None


def record_path(metadata: Path, output: str) -> Path:
    """Where Snakemake keeps an output's record (snakemake.persistence.file._record_path)."""
    name_max = os.pathconf(metadata, "PC_NAME_MAX") if metadata.is_dir() else 255
    b64 = base64.urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i : i + name_max - 1] for i in range(0, len(b64), name_max - 1)]
    return metadata.joinpath(*["@" + p for p in parts[:-1]], parts[-1])


def record_seconds(job: Job, root: Path) -> float | None:
    """Start to end of the job's last completed run, from Snakemake's records of its outputs."""
    span = record_span(job, root)
    return None if span is None else span[1] - span[0]


def record_span(job: Job, root: Path) -> tuple[float, float] | None:
    """When the job's last completed run started and ended (epoch seconds), from Snakemake's
    records of its outputs.

    A record counts only where the output exists with the modification time recorded as the
    job's end: a run that was killed can leave a record whose end is merely the time Snakemake
    gave up (its outputs absent), and an output changed since is no longer that run's."""
    metadata = root / ".snakemake" / "metadata"
    starts, ends = [], []
    for output in job.output:
        path, out = record_path(metadata, output), root / output
        if not path.is_file() or not out.exists():
            return None
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        start, end = rec.get("starttime"), rec.get("endtime")
        if rec.get("incomplete") or rec.get("rule") != job.rule:
            return None
        if not isinstance(start, int | float) or not isinstance(end, int | float):
            return None
        if abs(out.stat().st_mtime - end) > RECORD_TOLERANCE:
            return None
        starts.append(start)
        ends.append(end)
    if not starts or max(ends) < min(starts):
        return None
    return min(starts), max(ends)


def own_measurement(
    job: Job, root: Path, pauses: Sequence[tuple[datetime, datetime]] = ()
) -> Cost | None:
    """The job's own seconds. With ``pauses`` (a run paused as a whole, ``kill -STOP``, which
    its ``benchmark:`` files count in every job it held): its record's start to end less the
    pauses in it (:func:`run_log.paused`, on the machine's clock), where Snakemake has a record."""
    if pauses:
        span = record_span(job, root)
        if span is not None:
            start, end = (datetime.fromtimestamp(s) for s in span)
            seconds = span[1] - span[0] - paused(start, end, list(pauses)).total_seconds()
            return Cost(seconds, "measured", "Snakemake's record of the run, less its pauses")
    if job.benchmark:
        seconds = benchmark_seconds(root / job.benchmark)
        if seconds is not None:
            return Cost(seconds, "measured", "benchmark file")
    seconds = record_seconds(job, root)
    if seconds is not None:
        return Cost(seconds, "measured", "Snakemake's record of the run")
    return None


def _shape(w: dict[str, str]) -> dict[str, str]:
    """The wildcards with an attack job's victims first to last as their count."""
    if "first" not in w:
        return dict(w)
    return {**w, "victims": str(int(w["last"]) - int(w["first"]) + 1)}


def sweep_base(method: str) -> str:
    """A sweep's variant's base defense (``noise-std0.1``: ``noise``); any other name as it is."""
    return method.split(SWEPT)[0]


def fallback_groups(job: Job) -> list[tuple[str, tuple]]:
    """The groups whose measured median stands in for an unmeasured job, closest first."""
    w = _shape(job.w)
    same = (job.rule, tuple(sorted((k, v) for k, v in w.items() if k not in INSTANCE)))
    method = METHOD.get(job.rule)
    keep = {*SHAPE_WILDCARDS, method} if method else set(SHAPE_WILDCARDS)
    similar = (job.rule, tuple(sorted((k, v) for k, v in w.items() if k in keep)))
    groups = [("the same settings", same)]
    if method and similar != same:
        groups.append((f"the same {method}", similar))
    if method == "defense" and SWEPT in w.get("defense", ""):
        # a sweep's variant (noise-std0.1): its base defense at another strength
        base = {**dict(similar[1]), "defense": sweep_base(w["defense"])}
        groups.append((SWEEP_BASE, (job.rule, tuple(sorted(base.items())))))
    return groups


def default_costs(
    jobs: list[Job], root: Path, pauses: Sequence[tuple[datetime, datetime]] = ()
) -> dict[int, Cost]:
    """Each job's seconds: its own measurement (less ``pauses``: :func:`own_measurement`), a
    median of similar measured jobs, or None."""
    own = {j.jobid: own_measurement(j, root, pauses) for j in jobs if j.output}
    pools: dict[tuple, list[float]] = {}
    for job in jobs:
        cost = own.get(job.jobid)
        if cost is not None:
            for what, key in fallback_groups(job):
                if what != SWEEP_BASE:  # a variant's seconds are not its base's
                    pools.setdefault(key, []).append(cost.seconds)
    out: dict[int, Cost] = {}
    for job in jobs:
        if not job.output:
            out[job.jobid] = Cost(0.0, "measured", "no-op (an aggregate rule, no output)")
            continue
        cost = own.get(job.jobid)
        if cost is None:
            for what, key in fallback_groups(job):
                if pools.get(key):
                    n = len(pools[key])
                    cost = Cost(
                        statistics.median(pools[key]),
                        "estimated",
                        f"median of {n} measured {job.rule} job(s) with {what}",
                    )
                    break
        out[job.jobid] = cost or Cost(None, None, f"no measured {job.rule} job")
    return out
