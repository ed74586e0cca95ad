"""Carry a long run to another machine: save what its unfinished jobs still need, restore it in
a fresh clone there, and go on with the same command.

    python benchmarks/run_state.py save RUN_DIR ARCHIVE [--target all] [--leave-out GLOB ...]
                                   [--extra FILE ...] [--large MIB] [--progress-max MIB]
                                   [--workdir runs/micro
                                   --snakemake-option=--configfile=tests/configs/micro.yaml]
    python benchmarks/run_state.py restore ARCHIVE RUN_DIR [--cores N] [--extras-to DIR]

A run that outlives the machine it started on (a measured ``snakemake all`` of two days on a
development machine that is replaced between sessions, a laptop's run moved to a cluster) loses
everything outside git with it. Its finished jobs need not be carried whole: Snakemake reruns a
finished job only when a job that must still run needs one of its outputs and finds it missing
(a result whose consumers have all run can go: the scores stand without the captures behind
them), when an input is newer than its outputs, or when its recorded settings or code changed.
So the archive holds, from the run's working directory (the project, or an overlay's
``run_dir``: pass it with ``--workdir`` and the overlay with ``--snakemake-option``):

- every file that a job still to run reads (from ``snakemake -n TARGET``), except the files in
  git and those a cheap, deterministic job rebuilds (``--leave-out``, default
  ``data/prepared/*``: 27 MB at the default scale), which are recorded by their SHA-256 instead;
- Snakemake's records (``.snakemake/metadata``: each output's settings, code and input
  checksums) and logs (``.snakemake/log``, for ``benchmarks/run_log.py``);
- the jobs' ``benchmark:`` files and logs (``results/benchmarks``, ``results/logs``) and the saved
  progress of jobs under way (``results/.progress``, resumed on the other machine);
- the files that the records of a score file among those inputs name, each run's reconstruction
  and private batch: a table's report draws its grid of reconstructions from them without
  declaring them (the grid only illustrates; no number reads them), so they are carried as
  objects (below) whatever their size;
- ``--extra`` files (a run's heartbeats and pauses), restored to ``--extras-to``.

A kept file of ``--large`` MiB or more (default 1: a trained generator, a defended model's
checkpoint) is not put in the archive but beside it, in ``<name>.objects/`` (``all-state.objects``
for ``all-state.tar.xz``), under its SHA-256: a file that many saves of a long run hold, unchanged,
is then one file that git keeps once, where inside a compressed archive it would be stored again
with every save. Each save removes the objects its archive no longer names; commit the folder
with the archive (``git add -A``).

A job's saved progress changes every few minutes while it runs, so it is kept in the archive,
and one over ``--progress-max`` MiB (default 4: a ViT's Adam state under CVB's recipe is 17.6
MiB) is left out: that job starts over after a restore, and the save names it.

Runs deferred to MLflow (``mlflow.db.pending``) are not carried: they are for browsing, and no
number in a table comes from them.

``restore`` checks the objects against their SHA-256 first (one missing or different stops it,
with nothing restored), rebuilds the left-out files and checks each against its recorded SHA-256 (a
difference would leave finished results made from the old file beside new ones made from this
one: it stops there, with nothing extracted). It then moves the archived files into place, all
with one modification time, later than the rebuilt ones (Snakemake compares times, and a clone's
files are all new); a file in git that changed since the saved commit gets a later time still,
so the finished jobs that read it run again, as they would on the old machine. Last, it checks
that a dry run has the jobs left that the saved run had, rule by rule. The archive is written to
a temporary file and renamed; the restore extracts to a staging folder first, so a damaged
archive leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from gradinv.io import sha256_file as sha256

MANIFEST = "run_state.json"
PROGRESS = "results/.progress"  # the saved progress of jobs under way
RECORDS = (
    ".snakemake/metadata",
    ".snakemake/log",
    "results/benchmarks",
    "results/logs",
    PROGRESS,
)  # under the run's working directory
EXTRAS = "extras"
LARGE_MIB = 1.0  # a kept file this large or larger is stored beside the archive, by its SHA-256
SCORES = "results/metrics/"  # a score file's records name the reconstruction and victim files
PROGRESS_MAX_MIB = 4.0  # a job's saved progress larger than this is left out (it starts over)
ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}
TOTAL = re.compile(r"^total\s+(\d+)$")


class RunStateError(RuntimeError):
    """A run state that cannot be saved or restored as asked; the message says why and the fix."""


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


def dry_run(binary: str, run_dir: Path, args: list[str]) -> list[dict]:
    """The jobs a dry run would run: each one's rule, inputs and outputs (paths in the run's
    working directory). ``args``: the targets, then the options (``--config`` and
    ``--configfile`` take every word after them).

    ``--nolock``: the run may be going on beside the save; its jobs under way are among these.
    """
    text = snakemake(binary, run_dir, "-n", "--nolock", *args)
    jobs: list[dict] = []
    total = 0
    for line in text.splitlines():
        head = line.rstrip(":").split()
        if line.endswith(":") and len(head) == 2 and head[0] in ("rule", "localrule", "checkpoint"):
            jobs.append({"rule": head[1], "input": [], "output": []})
        elif jobs and line.startswith("    ") and ": " in line:
            key, _, value = line.strip().partition(": ")
            if key in ("input", "output"):
                jobs[-1][key] = [v for v in value.split(", ") if v]
        elif m := TOTAL.match(line.strip()):
            total = int(m.group(1))
    if len(jobs) != total:
        raise RunStateError(
            f"read {len(jobs)} jobs from the dry run, whose job table says {total}: this "
            "Snakemake prints its jobs in a form run_state.py does not know"
        )
    return jobs


def named_by_scores(run_dir: Path, workdir_path: Path, inputs: set[str]) -> list[str]:
    """The files, in ``run_dir``, that the records of the score files among ``inputs`` name
    (``reconstruction``, ``victim_file``: relative to the run's working directory) and that
    exist."""
    named = set()
    for f in inputs:
        path = workdir_path / f
        if not (f.startswith(SCORES) and f.endswith(".json") and path.is_file()):
            continue
        for record in json.loads(path.read_text()).get("runs", []):
            for key in ("reconstruction", "victim_file"):
                if record.get(key) and (workdir_path / record[key]).is_file():
                    rel = os.path.normpath(os.path.relpath(workdir_path / record[key], run_dir))
                    if not rel.startswith(".."):
                        named.add(rel)
    return sorted(named)


def by_rule(jobs: list[dict]) -> dict[str, int]:
    return dict(sorted(Counter(j["rule"] for j in jobs).items()))


def git(run_dir: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=run_dir, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunStateError(
            f"`git {' '.join(args)}` in {run_dir} failed: a run folder is a clone of gradinv "
            f"({done.stderr.strip()})"
        )
    return done.stdout


def objects_folder(archive: Path) -> Path:
    """Where the archive's large files lie: ``all-state.objects`` beside ``all-state.tar.xz``."""
    return archive.with_name(archive.name.split(".")[0] + ".objects")


def put_objects(folder: Path, run_dir: Path, objects: dict[str, str]) -> None:
    """Each large file once under its SHA-256 (written to a temporary name, then renamed); the
    ones the folder has already are not written again."""
    folder.mkdir(parents=True, exist_ok=True)
    for f, digest in objects.items():
        target = folder / digest
        if target.is_file() and sha256(target) == digest:
            continue
        partial = folder / f"{digest}.partial"
        try:
            shutil.copyfile(run_dir / f, partial)  # follows a DVC link to its content
            if sha256(partial) != digest:
                raise RunStateError(f"{run_dir / f} changed while it was saved: save again")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)


def prune_objects(folder: Path, objects: dict[str, str]) -> None:
    """Remove the objects the newest archive does not name (an earlier save's)."""
    wanted = set(objects.values())
    for p in folder.iterdir():
        if p.is_file() and p.name not in wanted:
            p.unlink()


def check_objects(folder: Path, objects: dict[str, str]) -> None:
    for f, digest in objects.items():
        p = folder / digest
        if not p.is_file():
            raise RunStateError(
                f"{p}, the saved {f}, is missing: the archive's objects folder comes with it "
                f"(commit and check out {folder.name}/ with the archive); nothing was restored"
            )
        if sha256(p) != digest:
            raise RunStateError(
                f"{p}, the saved {f}, is damaged (its SHA-256 is not its name); nothing was "
                "restored"
            )


def size_of(path: Path) -> int:
    """0 for a file that is gone (a job that ended meanwhile removes its progress folder)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def save(
    run_dir: Path,
    archive: Path,
    targets: list[str],
    leave_out: list[str],
    extras: list[Path],
    binary: str | None = None,
    options: list[str] | None = None,
    workdir: str = ".",
    large_mib: float = LARGE_MIB,
    progress_max_mib: float = PROGRESS_MAX_MIB,
) -> dict:
    """``workdir``: the run's working directory in ``run_dir`` (an overlay's ``run_dir``),
    ``options``: the Snakemake options the run was started with (that overlay); ``large_mib``:
    kept files this large or larger go beside the archive (``objects_folder``);
    ``progress_max_mib``: a job's saved progress larger than this is left out."""
    run_dir = run_dir.resolve()
    binary = snakemake_binary(run_dir, binary)
    options = options or []
    if git(run_dir, "status", "--porcelain", "--untracked-files=no").strip():
        raise RunStateError(
            f"{run_dir} has uncommitted changes to files in git: a restore starts from a commit, "
            "so commit them (or stash them and let the run see the commit) first"
        )
    workdir_path = (run_dir / workdir).resolve()
    if not workdir_path.is_relative_to(run_dir):
        raise RunStateError(f"the run's working directory {workdir_path} is outside {run_dir}")
    if not files_under(workdir_path / ".snakemake" / "metadata"):
        raise RunStateError(
            f"no job has finished in {workdir_path}: nothing to save there. A run with an overlay "
            "works in the overlay's run_dir: pass it (--workdir runs/micro) and the overlay "
            "(--snakemake-option=--configfile=...)"
        )
    jobs = dry_run(binary, run_dir, [*targets, *options])
    produced = {f for job in jobs for f in job["output"]}
    in_git = set(git(run_dir, "ls-files").splitlines())
    needed, missing = [], []
    inputs = {f for job in jobs for f in job["input"]} - produced
    for f in sorted(inputs):
        rel = os.path.normpath(os.path.relpath(workdir_path / f, run_dir))  # links unfollowed
        if rel.startswith(".."):
            raise RunStateError(f"{f}, an input of the jobs left, is outside {run_dir}")
        if rel in in_git:
            continue
        (needed if (run_dir / rel).is_file() else missing).append(rel)
    if missing:
        raise RunStateError(
            f"{len(missing)} inputs of the jobs left are not in {run_dir} ({missing[0]}, ...): "
            "pass the run's overlay (--snakemake-option=--configfile=...) and its folder "
            "(--workdir)"
        )
    workdir_rel = str(workdir_path.relative_to(run_dir))
    globs = [str(Path(workdir_rel) / g) for g in leave_out]
    left_out = [f for f in needed if any(fnmatch.fnmatch(f, g) for g in globs)]
    kept = [f for f in needed if f not in left_out]
    large = [f for f in kept if (run_dir / f).stat().st_size >= large_mib * 2**20]
    kept = [f for f in kept if f not in large]
    large += [
        f
        for f in named_by_scores(run_dir, workdir_path, inputs)
        if f not in in_git and f not in needed
    ]
    records = [
        str(p.relative_to(run_dir))
        for folder in RECORDS
        for p in files_under(workdir_path / folder)
    ]
    progress = workdir_path / PROGRESS
    too_large = [
        f
        for f in records
        if (run_dir / f).is_relative_to(progress)
        and size_of(run_dir / f) > progress_max_mib * 2**20
    ]
    records = [f for f in records if f not in too_large]
    manifest = {
        "saved": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git(run_dir, "rev-parse", "HEAD").strip(),
        "workdir": workdir_rel,
        "options": options,
        "targets": targets,
        "jobs_left": len(jobs),
        "jobs_left_by_rule": by_rule(jobs),
        "files": {f: sha256(run_dir / f) for f in kept},
        "objects": {f: sha256(run_dir / f) for f in large},
        "rebuilt": {f: sha256(run_dir / f) for f in left_out},
        "extras": [p.name for p in extras],
        "progress_left_out": too_large,
    }
    archive.parent.mkdir(parents=True, exist_ok=True)
    folder = objects_folder(archive)
    put_objects(folder, run_dir, manifest["objects"])  # before the archive that names them
    partial = archive.with_name(archive.name + ".partial")
    try:
        # dereference: a file DVC checked out as a link is stored with its content
        with tarfile.open(partial, "w:xz", dereference=True) as tar:
            blob = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime = len(blob), int(time.time())
            tar.addfile(info, io.BytesIO(blob))
            for f in kept:
                tar.add(run_dir / f, arcname=f, recursive=False)
            for f in records:
                # a job that ends meanwhile removes its progress folder
                with contextlib.suppress(FileNotFoundError):
                    tar.add(run_dir / f, arcname=f, recursive=False)
            for p in extras:
                tar.add(p, arcname=f"{EXTRAS}/{p.name}", recursive=False)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    prune_objects(folder, manifest["objects"])
    if not any(folder.iterdir()):
        folder.rmdir()
    return manifest


def allowed(name: str, manifest: dict) -> bool:
    """Whether an archive member is one that ``save`` writes (nothing else is extracted)."""
    workdir = Path(manifest["workdir"])
    return (
        name == MANIFEST
        or name in manifest["files"]
        or any(Path(name).is_relative_to(workdir / folder) for folder in RECORDS)
        or (name.startswith(f"{EXTRAS}/") and name.count("/") == 1)
    )


def restore(
    archive: Path,
    run_dir: Path,
    cores: str = "all",
    extras_to: Path | None = None,
    binary: str | None = None,
) -> dict:
    run_dir = run_dir.resolve()
    binary = snakemake_binary(run_dir, binary)
    staging = run_dir / ".run_state.staging"
    try:
        with tarfile.open(archive, "r:xz") as tar:
            manifest = json.loads(tar.extractfile(MANIFEST).read())
            members = tar.getmembers()
            strange = [m.name for m in members if not m.isfile() or not allowed(m.name, manifest)]
            if strange:
                raise RunStateError(
                    f"{archive} holds {strange[0]}, which run_state.py does not write: not a "
                    "saved run state, or a damaged one; nothing was restored"
                )
            objects = manifest.get("objects", {})  # none in an archive saved before them
            folder = objects_folder(archive)
            check_objects(folder, objects)
            for f, digest in {**manifest["files"], **objects}.items():
                if (run_dir / f).exists() and sha256(run_dir / f) != digest:
                    raise RunStateError(
                        f"{run_dir / f} exists and differs from the saved run's: restore into a "
                        "fresh clone (git clone), or delete the run's results first"
                    )
            rebuild(binary, run_dir, manifest, cores)
            shutil.rmtree(staging, ignore_errors=True)
            tar.extractall(staging, members=members, filter="data")
            for f, digest in objects.items():
                (staging / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(folder / digest, staging / f)
    except (OSError, tarfile.TarError, KeyError, ValueError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise RunStateError(
            f"reading {archive}: {e!r}; not a saved run state, or a damaged one; nothing was "
            "restored"
        ) from e
    now = time.time()
    staged = sorted(p for p in staging.rglob("*") if p.is_file())
    for path in staged:
        rel = path.relative_to(staging)
        if rel.parts[0] in (MANIFEST, EXTRAS):
            continue
        os.utime(path, (now, now))
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, run_dir / rel)
    if extras_to is not None:
        extras_to.mkdir(parents=True, exist_ok=True)
        for path in files_under(staging / EXTRAS):
            shutil.move(path, extras_to / path.name)
    shutil.rmtree(staging)
    manifest["changed_in_git"] = touch_changed(run_dir, manifest["commit"], now + 1)
    args = [*manifest["targets"], *manifest["options"]]
    left = dry_run(binary, run_dir, args)
    manifest["jobs_left_now"] = len(left)
    manifest["jobs_left_now_by_rule"] = by_rule(left)
    return manifest


def rebuild(binary: str, run_dir: Path, manifest: dict, cores: str) -> None:
    """Build the left-out files here and check each against the saved run's SHA-256."""
    rebuilt = manifest["rebuilt"]
    if not rebuilt:
        return
    workdir = run_dir / manifest["workdir"]
    targets = [os.path.relpath(run_dir / f, workdir) for f in rebuilt]
    snakemake(binary, run_dir, *targets, *manifest["options"], "--cores", cores)
    for f, digest in rebuilt.items():
        if sha256(run_dir / f) != digest:
            raise RunStateError(
                f"{f}, rebuilt here, differs from the saved run's (SHA-256 {digest[:12]}…): the "
                "finished results made from the old file would stand beside new ones made from "
                "this one. Nothing was restored; save again with the file kept "
                "(--leave-out none), or rerun from nothing"
            )


def touch_changed(run_dir: Path, saved: str, when: float) -> list[str] | None:
    """Give the files in git that changed since the saved commit a time later than the restored
    results', so that Snakemake reruns the finished jobs that read them. None: the saved commit
    is not in this clone's history, and nothing could be checked."""
    here = git(run_dir, "rev-parse", "HEAD").strip()
    if here == saved:
        return []
    try:
        names = git(run_dir, "diff", "--name-only", saved, here).split()
    except RunStateError:
        return None
    changed = [f for f in names if (run_dir / f).is_file()]
    for f in changed:
        os.utime(run_dir / f, (when, when))
    return changed


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
        help="glob (in the run's working directory) of files a cheap job rebuilds, recorded by "
        "hash (default: data/prepared/*; 'none' keeps every file)",
    )
    s.add_argument(
        "--extra", action="append", type=Path, default=[], help="a file kept beside the run"
    )
    s.add_argument(
        "--snakemake-option",
        action="append",
        default=[],
        help="an option the run was started with, such as --snakemake-option=--configfile=X",
    )
    s.add_argument(
        "--workdir",
        default=".",
        help="the run's working directory in RUN_DIR: an overlay's run_dir (default: .)",
    )
    s.add_argument(
        "--large",
        type=float,
        default=LARGE_MIB,
        help="MiB: a kept file this large or larger is stored beside the archive, in "
        "<name>.objects/ under its SHA-256, once however many saves hold it (default: 1)",
    )
    s.add_argument(
        "--progress-max",
        type=float,
        default=PROGRESS_MAX_MIB,
        help="MiB: a job's saved progress larger than this is left out, and that job starts "
        "over after a restore (default: 4)",
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
            targets = args.target or ["all"]
            m = save(
                args.run_dir,
                args.archive,
                targets,
                leave_out,
                args.extra,
                args.snakemake,
                args.snakemake_option,
                args.workdir,
                args.large,
                args.progress_max,
            )
            size = args.archive.stat().st_size / 2**20
            folder = objects_folder(args.archive)
            apart = sum(p.stat().st_size for p in files_under(folder)) / 2**20
            print(
                f"{args.archive}: {size:.1f} MiB; {m['jobs_left']} jobs left at "
                f"{m['commit'][:12]}; {len(m['files'])} files they read kept, "
                f"{len(m['rebuilt'])} to rebuild"
                + (
                    f"; {len(m['objects'])} large ones in {folder} ({apart:.1f} MiB)"
                    if m["objects"]
                    else ""
                )
            )
            for f in m["progress_left_out"]:
                print(f"left out {f}, over --progress-max: that job starts over after a restore")
            return 0
        m = restore(args.archive, args.run_dir, args.cores, args.extras_to, args.snakemake)
    except RunStateError as e:
        print(f"run_state: {e}", file=sys.stderr)
        return 2
    return report(m, git(args.run_dir.resolve(), "rev-parse", "HEAD").strip())


def report(m: dict, here: str) -> int:
    """What the restore did; 1 where the jobs left differ from the saved run's for no reason."""
    restored = len(m["files"]) + len(m.get("objects", {}))
    print(
        f"restored {restored} files, rebuilt {len(m['rebuilt'])}; the saved run had "
        f"{m['jobs_left']} jobs left at {m['commit'][:12]}, a dry run here at {here[:12]} has "
        f"{m['jobs_left_now']}"
    )
    changed = m["changed_in_git"]
    if changed is None:
        print(
            "run_state: the saved commit is not in this clone's history: files in git that "
            "changed since are not known, and their finished jobs may not run again",
            file=sys.stderr,
        )
    elif changed:
        print(
            f"{len(changed)} files in git changed since the saved commit; the finished jobs "
            "that read them run again"
        )
    if m["jobs_left_now_by_rule"] == m["jobs_left_by_rule"]:
        return 0
    for rule in sorted(set(m["jobs_left_by_rule"]) | set(m["jobs_left_now_by_rule"])):
        was, now = m["jobs_left_by_rule"].get(rule, 0), m["jobs_left_now_by_rule"].get(rule, 0)
        if was != now:
            print(f"  {rule}: {was} saved, {now} now", file=sys.stderr)
    if here == m["commit"]:
        print(
            "run_state: at the saved commit a restore leaves the same jobs; these differ "
            "(`snakemake -n` says why each runs)",
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
