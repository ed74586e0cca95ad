"""The stages' one call into MLflow: log a finished job, never fail it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradinv.config import project_root


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
) -> str | None:
    from gradinv.tracking import log_run

    tracking = settings["tracking"]
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
    return log_run(
        experiment=tracking["experiment"],
        run_name=run_name,
        job_key=job_key,
        params=params,
        metrics=metrics,
        history=history,
        tags=tags,
        images=images,
        artifacts=artifacts,
        status="FINISHED" if summary.get("status", "ok") == "ok" else "FAILED",
        project_root=project_root(),
        enabled=tracking["enabled"],
    )
