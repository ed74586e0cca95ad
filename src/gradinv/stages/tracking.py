"""The stages' one call into MLflow: log a finished job, never fail it.

Under Snakemake a job's run is deferred (params.yaml ``tracking.defer``, the default): the job
saves it to the pending folder and :func:`flush` logs them all when the workflow ends (the
Snakefile's ``onsuccess``/``onerror``; ``onstart`` logs what an interrupted workflow left). A
stage called outside Snakemake logs at once.

A run that cannot be logged (store locked past every retry, disk full, MLflow broken) is printed
in the job's log (or the workflow's, for a flush) and appended to
``results/logs/tracking-failures.log``; the Snakefile reports the count when the workflow ends.
The job itself succeeds: its results are on disk.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from gradinv.config import project_root, run_root

ENV_EXPERIMENT = "GRADINV_TRACKING_EXPERIMENT"
ENV_ENABLED = "GRADINV_TRACKING_ENABLED"
ENV_DEFER = "GRADINV_TRACKING_DEFER"
_FALSE = ("0", "false", "no", "off")


def tracking_target() -> tuple[str, bool]:
    """The MLflow experiment and whether to log, as the Snakefile set them from params.yaml."""
    enabled = os.environ.get(ENV_ENABLED, "true").lower() not in _FALSE
    return os.environ.get(ENV_EXPERIMENT, "gradinv"), enabled


def deferred() -> bool:
    """Whether jobs leave their run pending (the Snakefile sets it; unset, they log at once)."""
    return os.environ.get(ENV_DEFER, "false").lower() not in _FALSE


def log_job(
    settings: dict[str, Any],
    *,
    kind: str,
    run_name: str,
    job_key: str,
    params: dict[str, Any],
    metrics: dict[str, float | None],
    history: dict[str, list[tuple[int, float]]] | None = None,
    summary: dict[str, Any],
    images: dict[str, Any] | None = None,
    artifacts: dict[str, Path] | None = None,
    unavailable: dict[str, str] | None = None,
) -> str | None:
    """Log one finished job's run. ``unavailable`` names each metric the job could not compute
    and why (LPIPS without its weights): a tag, and the run's description in the UI."""
    from gradinv.tracking import log_run, tracking_enabled

    experiment, enabled = tracking_target()
    tags = {
        "gradinv.kind": kind,
        "gradinv.status": summary.get("status", "ok"),
        "gradinv.scale": settings["scale"],
        "gradinv.seed": str(settings["seed"]),
        "gradinv.config_hash": summary.get("config_hash", ""),
        "gradinv.data_sha256": summary.get("data_sha256", ""),
    }
    if summary.get("failure"):
        tags["gradinv.failure"] = str(summary["failure"])[:5000]
    if unavailable:
        said = "; ".join(f"{name}: {why}" for name, why in unavailable.items())
        tags["gradinv.unavailable_metrics"] = said[:5000]
        tags["mlflow.note.content"] = f"Unavailable metrics (not logged, never faked): {said}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = log_run(
            experiment=experiment,
            run_name=run_name,
            job_key=job_key,
            params=params,
            metrics=metrics,
            history=history,
            tags=tags,
            images=images,
            artifacts=artifacts,
            status="FAILED" if summary.get("status", "ok") == "failed" else "FINISHED",
            project_root=project_root(),
            enabled=enabled,
            defer=deferred(),
        )
    for w in caught:
        print(f"gradinv: WARNING: {w.message}", file=sys.stderr)
    if run_id is None and tracking_enabled(enabled):
        reason = "; ".join(str(w.message) for w in caught) or "unknown reason"
        _report_failure(job_key, reason)
    return run_id


def flush() -> int:
    """Log every pending run to MLflow; report the ones that fail; return how many were logged."""
    from gradinv.tracking import flush_pending

    _, enabled = tracking_target()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logged, failed = flush_pending(project_root(), enabled=enabled)
    for w in caught:
        print(f"gradinv: WARNING: {w.message}", file=sys.stderr)
    for failure in failed:
        print(f"gradinv: WARNING: {failure['reason']}", file=sys.stderr)
        _report_failure(failure["job"], failure["reason"])
    return logged


FAILURES = Path("results") / "logs" / "tracking-failures.log"


def _report_failure(job_key: str, reason: str) -> None:
    """The science job succeeded but its MLflow run is missing: say so where the run ends."""
    path = run_root() / FAILURES
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"job": job_key, "reason": reason[:2000]}) + "\n"
    with open(path, "a") as f:  # one short O_APPEND write per job: lines never interleave
        f.write(line)


def tracking_failures() -> list[dict[str, str]]:
    path = run_root() / FAILURES
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
