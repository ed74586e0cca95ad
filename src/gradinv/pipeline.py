"""What the Snakefile needs before any rule runs: a clean environment and a valid config."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def setup_environment(basedir: str) -> None:
    """Telemetry off, no leaked MLflow run, and `gradinv` on PATH for every job.

    Jobs call `gradinv`; it is found beside the Python that runs Snakemake even when no virtual
    environment is activated. ``GRADINV_PROJECT_ROOT`` anchors relative paths and the MLflow store.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.pop("MLFLOW_RUN_ID", None)
    os.environ["GRADINV_PROJECT_ROOT"] = str(Path(basedir).resolve())
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def validated(config: dict[str, Any]) -> dict[str, Any]:
    """Validate Snakemake's merged config; a bad key stops the run before any job starts."""
    from snakemake.exceptions import WorkflowError

    from gradinv.config import validate
    from gradinv.settings import ConfigError

    try:
        return validate(config, source="params.yaml (with any --configfile overlays)")
    except ConfigError as err:
        raise WorkflowError(str(err)) from None
