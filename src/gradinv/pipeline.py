"""What the Snakefile needs before any rule runs: a clean environment and a valid config."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

OWNER = Path(".snakemake") / "gradinv-owner.json"


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


def export_runtime(config: dict[str, Any]) -> list[str]:
    """Pass how jobs run (not what they compute) through the environment; return the names.

    These settings are not part of any job's parameters, so changing the MLflow experiment or
    the progress interval reruns nothing.
    """
    values = {
        "GRADINV_TRACKING_EXPERIMENT": config["tracking"]["experiment"],
        "GRADINV_TRACKING_ENABLED": str(config["tracking"]["enabled"]).lower(),
        "GRADINV_TRACKING_DEFER": str(config["tracking"].get("defer", True)).lower(),
        "GRADINV_PROGRESS_EVERY": str(config["progress"]["every_seconds"]),
    }
    os.environ.update(values)
    return sorted(values)


def claim_lock(workdir: str | Path = ".") -> None:
    """Record which Snakemake process holds the working directory's lock (``onstart``)."""
    path = Path(workdir) / OWNER
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    owner = {"pid": pid, "host": socket.gethostname(), "started": _start_time(pid)}
    path.write_text(json.dumps(owner))


def release_lock(workdir: str | Path = ".") -> None:
    """The run ended normally (``onsuccess``/``onerror``): Snakemake removes its own lock."""
    (Path(workdir) / OWNER).unlink(missing_ok=True)


def clear_stale_lock(workdir: str | Path = ".") -> bool:
    """Remove Snakemake's lock if the process that took it was killed (SIGKILL, OOM killer).

    Snakemake cannot release its lock when it is killed, and the next run would stop with
    "Directory cannot be locked". The owner record written by :func:`claim_lock` tells whether
    that process still exists; only a lock whose owner is gone from this host is removed.
    """
    workdir = Path(workdir)
    locks, owner_file = workdir / ".snakemake" / "locks", workdir / OWNER
    if not owner_file.exists() or not any(locks.glob("*.lock")):
        return False
    try:
        owner = json.loads(owner_file.read_text())
    except (OSError, ValueError):
        return False
    if owner.get("host") != socket.gethostname() or _alive(owner["pid"], owner.get("started")):
        return False
    for lock in locks.glob("*.lock"):
        lock.unlink(missing_ok=True)
    owner_file.unlink(missing_ok=True)
    print(
        f"gradinv: removed the lock left by Snakemake process {owner['pid']}, which was killed; "
        "continuing where it stopped (unfinished jobs are rerun, finished ones kept)",
        file=sys.stderr,
    )
    return True


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time since boot (tells a reused pid from the original)."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: trust kill(0)
    if fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return False
    return started is None or len(fields) <= 19 or fields[19] == started


def report_tracking_failures() -> None:
    """At the end of a run: name the jobs whose MLflow run could not be written."""
    from gradinv.stages.tracking import FAILURES, tracking_failures

    failures = tracking_failures()
    if failures:
        print(
            f"gradinv: {len(failures)} job(s) finished but could not be logged to MLflow "
            f"(first: {failures[0]['job']}: {failures[0]['reason'][:300]}). Their results are "
            f"on disk; the list is in {FAILURES}. Fix the store, delete that file and the "
            "jobs' outputs to log them again.",
            file=sys.stderr,
        )


def finished_outputs(root: str | Path = ".") -> dict[str, int]:
    """Per-job outputs under results/ that Snakemake recorded as complete, with their mtimes.

    A file with an incomplete marker (its job was killed before Snakemake saw it finish) is left
    out: the next run redoes it. Used to check that a resumed run recomputes nothing finished.
    """
    import base64

    root = Path(root)
    markers = (root / ".snakemake" / "incomplete").glob("*")
    incomplete = {base64.b64decode(p.name.encode()).decode() for p in markers if p.is_file()}
    out = {}
    for stage in ("checkpoints", "train", "victims", "captures", "attacks", "metrics"):
        for path in (root / "results" / stage).rglob("*"):
            rel = str(path.relative_to(root))
            if path.is_file() and not path.name.startswith(".") and rel not in incomplete:
                out[rel] = path.stat().st_mtime_ns
    return out
