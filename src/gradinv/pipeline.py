"""What the Snakefile needs before any rule runs: a clean environment and a valid config."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OWNERS = Path(".snakemake") / "gradinv-lock-owners"  # a record per Snakemake lock file


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


def validated(config: dict[str, Any], configfiles: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Validate Snakemake's merged config; a bad key stops the run before any job starts.

    ``configfiles`` (the Snakefile's ``workflow.configfiles``: params.yaml and every
    ``--configfile``) are read again by gradinv's reader, so that a file is refused for the same
    reason, in the same words, as by ``gradinv validate``, whether or not the guard
    (:mod:`gradinv.config_guard`) made Snakemake read them with it. Without the guard a warning
    says that Snakemake read them with YTE first.
    """
    from snakemake.exceptions import WorkflowError

    from gradinv import config_guard
    from gradinv.config import project_root, validate
    from gradinv.config_files import read_config_file
    from gradinv.settings import ConfigError
    from gradinv.table_inputs import check_scored_samples

    guarded = config_guard.active()
    if not guarded:
        print(
            "gradinv: WARNING: this environment does not guard Snakemake's configuration "
            "loader: a --configfile with __use_yte__ runs its Python before gradinv can refuse "
            "it. Run `gradinv guard install` once (make env does).",
            file=sys.stderr,
        )
    try:
        for path in configfiles:
            read_config_file(path)
        checked = validate(
            config,
            source="params.yaml (with any --configfile overlays)",
            checked=project_root() / ".snakemake" / "gradinv-checked",
        )
        # which samples each score job scores (a table with DCS²): a table whose DCS² defenses
        # disagree, or runs two tables would score differently, stop here, before any job
        check_scored_samples(checked)
        return checked
    except ConfigError as err:
        raise WorkflowError(f"gradinv: {err}") from None


def run_dir(config: dict[str, Any], workflow: Any) -> str:
    """The run's folder (``run_dir``, against the Snakefile's folder), for the Snakefile's
    ``workdir:``; exported as ``GRADINV_RUN_ROOT`` for the jobs (:func:`gradinv.config.run_root`).

    Snakemake's ``--directory`` wins over ``workdir:`` and has already been entered, so then the
    current folder is the run's."""
    if workflow.overwrite_workdir is not None:
        root = Path.cwd()
    else:
        root = Path(workflow.basedir) / Path(config["run_dir"]).expanduser()
    root = root.resolve()
    os.environ["GRADINV_RUN_ROOT"] = str(root)
    return str(root)


def project_file(workflow: Any, path: str) -> str:
    """A file of the project (``workflow/claims.yaml``) as a rule's input: its path from the
    run's folder, so that the default run (``run_dir: .``) records it as it always has."""
    return os.path.relpath(Path(workflow.basedir) / path, Path.cwd())


def rerun_options(configfiles: Sequence[str | Path], argv: Sequence[str] | None = None) -> str:
    """The options that choose what a run computes, as one shell string: its ``--configfile``
    overlays and its profile. A job's "Regenerate it with" hint repeats them
    (``GRADINV_SNAKEMAKE_OPTIONS``), so the file is rebuilt at the run's scale, not the default's.
    """
    root = Path.cwd().resolve()
    shown = []
    for path in configfiles:
        path = Path(path).resolve()
        shown.append(str(path.relative_to(root)) if path.is_relative_to(root) else str(path))
    words = ["--configfile", *shown] if shown else []
    parser = argparse.ArgumentParser(add_help=False)
    for option in ("--profile", "--workflow-profile"):
        parser.add_argument(option)
    known, _ = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    for option in ("--profile", "--workflow-profile"):
        value = getattr(known, option[2:].replace("-", "_"))
        if value:
            words += [option, value]
    return shlex.join(words)


def export_runtime(config: dict[str, Any], overlays: Sequence[str | Path] = ()) -> list[str]:
    """Pass how jobs run (not what they compute) through the environment; return the names.

    These settings are not part of any job's parameters, so changing the MLflow experiment or
    the progress interval reruns nothing. ``overlays`` are the run's ``--configfile`` files,
    repeated in the jobs' recovery hints (:func:`rerun_options`).
    """
    values = {
        "GRADINV_SNAKEMAKE_OPTIONS": rerun_options(overlays),
        "GRADINV_TRACKING_EXPERIMENT": config["tracking"]["experiment"],
        "GRADINV_TRACKING_ENABLED": str(config["tracking"]["enabled"]).lower(),
        "GRADINV_TRACKING_DEFER": str(config["tracking"].get("defer", True)).lower(),
        "GRADINV_PROGRESS_EVERY": str(config["progress"]["every_seconds"]),
    }
    if config["tracking"].get("uri"):  # else the jobs' own default: the project's mlflow.db
        values["GRADINV_TRACKING_URI"] = config["tracking"]["uri"]
    os.environ.update(values)
    return sorted(values)


def claim_lock(persistence: Any, workdir: str | Path = ".") -> None:
    """``onstart``: own the lock files Snakemake just wrote for this run, and only those.

    Several Snakemake runs may share a folder when their files do not overlap; each writes its
    own ``.snakemake/locks/<i>.{input,output}.lock``. Snakemake 9's file backend, at the end of
    a run, removes its lock files and then the whole ``locks`` folder, the other runs' locks
    with it, so a later run of a target still being built would start it again. Here a run
    removes its own lock files only (:func:`_own_locks_only`), and each lock file gets an
    owner record, ``.snakemake/gradinv-lock-owners/<lock file>.json``, that tells
    :func:`clear_stale_lock` whether the process that wrote it still exists.
    """
    lockfiles = [Path(f) for f in getattr(persistence, "_lockfile", {}).values()]
    _own_locks_only(persistence)
    owners = Path(workdir) / OWNERS
    owners.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    record = json.dumps({"pid": pid, "host": socket.gethostname(), "started": _start_time(pid)})
    for lockfile in lockfiles:
        tmp = owners / f".{lockfile.name}.tmp"
        tmp.write_text(record)
        tmp.replace(owners / f"{lockfile.name}.json")


def _own_locks_only(persistence: Any) -> None:
    """Make Snakemake's file persistence remove this run's lock files, not the folder."""
    lockfiles = getattr(persistence, "_lockfile", None)
    if not isinstance(lockfiles, dict) or not hasattr(persistence, "_delete_locks"):
        print(
            "gradinv: WARNING: this Snakemake's persistence has no lock files to own (a "
            f"{type(persistence).__name__}); do not start two runs in this folder at once.",
            file=sys.stderr,
        )
        return

    def delete_own_locks() -> None:
        for lockfile in lockfiles.values():
            Path(lockfile).unlink(missing_ok=True)
        lockfiles.clear()

    persistence._delete_locks = delete_own_locks


def release_lock(persistence: Any = None, workdir: str | Path = ".") -> None:
    """The run ended (``onsuccess``/``onerror``): drop its owner records (Snakemake then removes
    its lock files)."""
    lockfiles = getattr(persistence, "_lockfile", {}) if persistence is not None else {}
    for lockfile in lockfiles.values():
        (Path(workdir) / OWNERS / f"{Path(lockfile).name}.json").unlink(missing_ok=True)


def clear_stale_lock(workdir: str | Path = ".") -> bool:
    """Remove the lock files of runs that were killed (SIGKILL, OOM killer); keep the others.

    Snakemake cannot release its lock when it is killed, and the next run would stop with
    "Directory cannot be locked". A lock file whose owner record (:func:`claim_lock`) names a
    process gone from this host is removed with its record; a lock of a live run, of another
    host, or without a record (a run that had not reached ``onstart``) stays.
    """
    workdir = Path(workdir)
    locks, owners = workdir / ".snakemake" / "locks", workdir / OWNERS
    removed = []
    for record in sorted(owners.glob("*.lock.json")):
        try:
            owner = json.loads(record.read_text())
            pid, host = int(owner["pid"]), owner.get("host")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host != socket.gethostname() or _alive(pid, owner.get("started")):
            continue
        (locks / record.name.removesuffix(".json")).unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        removed.append(pid)
    if removed:
        print(
            f"gradinv: removed the lock left by Snakemake process "
            f"{', '.join(map(str, sorted(set(removed))))}, which was killed; continuing where it "
            "stopped (unfinished jobs are rerun, finished ones kept)",
            file=sys.stderr,
        )
    return bool(removed)


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
