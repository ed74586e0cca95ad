"""Carry a long run to another machine: save what its unfinished jobs still need, restore it in
a fresh clone there, and go on with the same command.

    python benchmarks/run_state.py save RUN_DIR ARCHIVE [--target all] [--leave-out GLOB ...]
                                   [--extra FILE ...] [--results results]
    python benchmarks/run_state.py restore ARCHIVE RUN_DIR [--cores N] [--extras-to DIR]

A run that outlives the machine it started on (a measured ``snakemake all`` of two days on a
development machine that is replaced between sessions, a laptop's run moved to a cluster) loses
everything outside git with it. Its finished jobs need not be carried whole: Snakemake reruns a
finished job only when a job that must still run needs one of its outputs and finds it missing
(a result whose consumers have all run can go: the scores stand without the captures behind
them), when an input is newer than its outputs, or when its recorded settings or code changed.
So the archive holds:

- every existing file that a job still to run reads (from ``snakemake -n TARGET``), except those
  a cheap, deterministic job rebuilds (``--leave-out``, default ``data/prepared/*``: 27 MB at the
  default scale), which are recorded by their SHA-256 instead;
- Snakemake's records (``.snakemake/metadata``: each output's settings, code and input
  checksums) and logs (``.snakemake/log``, for ``benchmarks/run_log.py``);
- the jobs' ``benchmark:`` files and logs (``results/benchmarks``, ``results/logs``) and the saved
  progress of jobs under way (``results/.progress``, resumed on the other machine); an overlay
  with its own ``run_dir`` has them under ``--results`` (``runs/micro/results``, say);
- ``--extra`` files (a run's heartbeats and pauses), restored to ``--extras-to``.

``restore`` rebuilds the left-out files first and checks each against its recorded SHA-256 (a
difference would rerun every finished job that read the file: it stops there, with nothing
extracted). It then moves the archived files into place, all with one modification time, later
than the rebuilt ones (Snakemake compares times, and a clone's files are all new), and checks that
a dry run has as many jobs left as the saved run had. The archive is written to a temporary file
and renamed; the restore extracts to a staging folder first.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

MANIFEST = "run_state.json"
SNAKEMAKE_RECORDS = (".snakemake/metadata", ".snakemake/log")
JOB_RECORDS = ("benchmarks", "logs", ".progress")  # under the run's results folder
EXTRAS = "extras"
ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}


class RunStateError(RuntimeError):
    """A run state that cannot be saved or restored as asked; the message says why and the fix."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snakemake_binary(run_dir: Path, given: str | None) -> str:
    """The Snakemake of the run's own environment (``RUN_DIR/.venv``), else the one on PATH."""
    if given:
        return given
    own = run_dir / ".venv" / "bin" / "snakemake"
    found = str(own) if own.exists() else shutil.which("snakemake")
    if not found:
        raise RunStateError("no snakemake: create the run's environment first (make env)")
    return found


def snakemake(binary: str, run_dir: Path, *args: str) -> str:
    env = {**os.environ, **ENV}
    done = subprocess.run([binary, *args], cwd=run_dir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunStateError(
            f"`snakemake {' '.join(args)}` in {run_dir} failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout + done.stderr


def jobs_left(binary: str, run_dir: Path, targets: list[str]) -> list[dict[str, list[str]]]:
    """The jobs a dry run of ``targets`` would run: each one's rule, inputs and outputs.

    ``--nolock``: the run may be going on beside the save; its jobs under way are among these.
    """
    text = snakemake(binary, run_dir, "-n", "--nolock", *targets)
    jobs: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        head = line.rstrip(":").split()
        if line.endswith(":") and len(head) == 2 and head[0] in ("rule", "localrule", "checkpoint"):
            jobs.append({"rule": [head[1]], "input": [], "output": []})
        elif jobs and line.startswith("    ") and ":" in line:
            key, _, value = line.strip().partition(": ")
            if key in ("input", "output"):
                jobs[-1][key] = [v for v in value.split(", ") if v]
    return jobs


def tracked(run_dir: Path) -> set[str]:
    done = subprocess.run(["git", "ls-files"], cwd=run_dir, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunStateError(f"{run_dir} is not a git checkout: a run folder is a clone of gradinv")
    return set(done.stdout.splitlines())


def files_under(run_dir: Path, folder: str) -> list[str]:
    root = run_dir / folder
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(run_dir)) for p in root.rglob("*") if p.is_file())


def commit_of(run_dir: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=run_dir, capture_output=True, text=True)
    return done.stdout.strip()


def save(
    run_dir: Path,
    archive: Path,
    targets: list[str],
    leave_out: list[str],
    extras: list[Path],
    binary: str | None = None,
    results: str = "results",
) -> dict:
    run_dir = run_dir.resolve()
    binary = snakemake_binary(run_dir, binary)
    jobs = jobs_left(binary, run_dir, targets)
    produced = {f for job in jobs for f in job["output"]}
    in_git = tracked(run_dir)
    needed = sorted({f for job in jobs for f in job["input"]} - produced - in_git)
    needed = [f for f in needed if (run_dir / f).is_file()]
    left_out = [f for f in needed if any(fnmatch.fnmatch(f, g) for g in leave_out)]
    kept = [f for f in needed if f not in left_out]
    folders = [*SNAKEMAKE_RECORDS, *(f"{results}/{name}" for name in JOB_RECORDS)]
    records = [f for folder in folders for f in files_under(run_dir, folder)]
    manifest = {
        "saved": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_of(run_dir),
        "targets": targets,
        "jobs_left": len(jobs),
        "jobs_left_by_rule": dict(sorted(Counter(j["rule"][0] for j in jobs).items())),
        "files": {f: sha256(run_dir / f) for f in kept},
        "rebuilt": {f: sha256(run_dir / f) for f in left_out},
        "extras": [p.name for p in extras],
    }
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz") as tar:
        blob = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(blob), int(time.time())
        tar.addfile(info, io.BytesIO(blob))
        for f in kept + records:
            tar.add(run_dir / f, arcname=f, recursive=False)
        for p in extras:
            tar.add(p, arcname=f"{EXTRAS}/{p.name}", recursive=False)
    os.replace(partial, archive)
    return manifest


def restore(
    archive: Path,
    run_dir: Path,
    cores: str = "all",
    extras_to: Path | None = None,
    binary: str | None = None,
) -> dict:
    run_dir = run_dir.resolve()
    binary = snakemake_binary(run_dir, binary)
    with tarfile.open(archive, "r:xz") as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())
        for f, digest in manifest["files"].items():
            if (run_dir / f).exists() and sha256(run_dir / f) != digest:
                raise RunStateError(
                    f"{run_dir / f} exists and differs from the saved run's: restore into a fresh "
                    "clone (git clone), or delete the run's results first"
                )
        rebuilt = manifest["rebuilt"]
        if rebuilt:
            snakemake(binary, run_dir, *rebuilt, "--cores", cores)
            for f, digest in rebuilt.items():
                if sha256(run_dir / f) != digest:
                    raise RunStateError(
                        f"{f}, rebuilt here, differs from the saved run's "
                        f"(SHA-256 {digest[:12]}…): every finished job that read it would run "
                        "again. Nothing was restored; "
                        "save again with the file kept (--leave-out none), or rerun from nothing"
                    )
        staging = run_dir / ".run_state.staging"
        shutil.rmtree(staging, ignore_errors=True)
        tar.extractall(staging, filter="data")
    now = time.time()
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        rel = path.relative_to(staging)
        if str(rel) == MANIFEST:
            continue
        if rel.parts[0] == EXTRAS:
            if extras_to is not None:
                extras_to.mkdir(parents=True, exist_ok=True)
                os.replace(path, extras_to / rel.name)
            continue
        os.utime(path, (now, now))
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, run_dir / rel)
    shutil.rmtree(staging)
    left = jobs_left(binary, run_dir, manifest["targets"])
    manifest["jobs_left_now"] = len(left)
    manifest["jobs_left_now_by_rule"] = dict(sorted(Counter(j["rule"][0] for j in left).items()))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("save", help="archive what a run's unfinished jobs need")
    s.add_argument("run_dir", type=Path)
    s.add_argument("archive", type=Path)
    s.add_argument("--target", action="append", help="the run's targets (default: all)")
    s.add_argument(
        "--leave-out",
        action="append",
        help="glob of files a cheap job rebuilds, recorded by hash (default: "
        "data/prepared/*; 'none' keeps every file)",
    )
    s.add_argument(
        "--extra",
        action="append",
        type=Path,
        default=[],
        help="a file kept beside the run (heartbeats, pauses)",
    )
    s.add_argument(
        "--results",
        default="results",
        help="the run's results folder, relative to RUN_DIR (default: results)",
    )
    s.add_argument("--snakemake", help="the snakemake to run (default: RUN_DIR/.venv's)")
    r = verbs.add_parser("restore", help="put a saved run into a fresh clone")
    r.add_argument("archive", type=Path)
    r.add_argument("run_dir", type=Path)
    r.add_argument("--cores", default="all", help="for rebuilding the left-out files")
    r.add_argument("--extras-to", type=Path, help="where the --extra files go (default: left)")
    r.add_argument("--snakemake", help="the snakemake to run (default: RUN_DIR/.venv's)")
    args = parser.parse_args(argv)
    try:
        if args.verb == "save":
            leave_out = [g for g in (args.leave_out or ["data/prepared/*"]) if g != "none"]
            m = save(
                args.run_dir,
                args.archive,
                args.target or ["all"],
                leave_out,
                args.extra,
                args.snakemake,
                args.results,
            )
            size = args.archive.stat().st_size / 2**20
            print(
                f"{args.archive}: {size:.1f} MiB; {m['jobs_left']} jobs left at "
                f"{m['commit'][:12]}; {len(m['files'])} files they read kept, "
                f"{len(m['rebuilt'])} to rebuild"
            )
            return 0
        m = restore(args.archive, args.run_dir, args.cores, args.extras_to, args.snakemake)
    except RunStateError as e:
        print(f"run_state: {e}", file=sys.stderr)
        return 2
    here = commit_of(args.run_dir)
    print(
        f"restored {len(m['files'])} files, rebuilt {len(m['rebuilt'])}; the saved run had "
        f"{m['jobs_left']} jobs left at {m['commit'][:12]}, a dry run here at {here[:12]} has "
        f"{m['jobs_left_now']}"
    )
    if m["jobs_left_now"] == m["jobs_left"]:
        return 0
    for rule in sorted(set(m["jobs_left_by_rule"]) | set(m["jobs_left_now_by_rule"])):
        was, now = m["jobs_left_by_rule"].get(rule, 0), m["jobs_left_now_by_rule"].get(rule, 0)
        if was != now:
            print(f"  {rule}: {was} saved, {now} now", file=sys.stderr)
    if here == m["commit"]:
        print(
            "run_state: at the saved commit a restore must leave the same jobs: some files the "
            "run needs were not restored",
            file=sys.stderr,
        )
        return 1
    print(
        "run_state: another commit than the saved one: its changes decide what reruns",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
