"""benchmarks/run_state.py: a run saved half-way on one machine and restored in a fresh clone on
another goes on where it was, with nothing finished run again; a file in git changed since the
save reruns what read it; a left-out file that does not rebuild the same stops the restore
before anything is restored.

The workflow is a small one of the same shape as gradinv's: a shared input (``a``, rebuilt
cheaply, like the prepared dataset), per-victim chains (``b{i}`` then ``c{i}``, like a capture
and its attack) and a job that reads the shared input and a file in git directly (``d``, like a
utility run reading its partition and params). ``a`` is over 1 MB, as the prepared dataset is:
Snakemake compares smaller inputs by content, larger ones by time. Its working directory is
``run_dir``, as an overlay's is."""

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_state  # noqa: E402

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

WORKFLOW = """
import os
workdir: config.get("run_dir", ".")
REF = os.path.relpath(f"{{workflow.basedir}}/ref.txt")  # as gradinv's pipeline.project_file
rule all:
    input: "out/c1.txt", "out/c2.txt", "out/d.txt"
rule a:
    output: "out/a.txt"
    shell: "{A} > {{output}}; head -c 1100000 /dev/zero >> {{output}}"
rule b:
    input: "out/a.txt"
    output: "out/b{{i}}.txt"
    shell: "head -n 1 {{input}} > {{output}}; echo {{wildcards.i}} >> {{output}}"
rule c:
    input: "out/b{{i}}.txt"
    output: "out/c{{i}}.txt"
    shell: "cat {{input}} > {{output}}"
rule d:
    input: "out/a.txt", REF
    output: "out/d.txt"
    shell: "wc -c < {{input[0]}} > {{output}}; cat {{input[1]}} >> {{output}}"
"""


def git(path: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=path,
        check=True,
        capture_output=True,
    )


def repository(path: Path, a_command: str = "echo shared") -> Path:
    """A git repository of the workflow at ``path``."""
    path.mkdir()
    (path / "Snakefile").write_text(WORKFLOW.format(A=a_command))
    (path / "ref.txt").write_text("v1\n")
    git(path, "init", "-q")
    git(path, "add", "Snakefile", "ref.txt")
    git(path, "commit", "-q", "-m", "w")
    return path


def clone(origin: Path, path: Path) -> Path:
    """A fresh clone: the workflow and its history, none of the run's files."""
    subprocess.run(["git", "clone", "-q", str(origin), str(path)], check=True)
    return path


def build(run: Path, *args: str) -> None:
    subprocess.run([SNAKEMAKE, *args, "--cores", "1"], cwd=run, check=True, capture_output=True)


def rules(run: Path, *args: str) -> list[str]:
    jobs = run_state.dry_run(SNAKEMAKE, run, ["all", *args])
    return sorted(j["rule"] for j in jobs)


@pytest.fixture
def saved(tmp_path):
    """A run with c1 and d finished, b2, c2 and all to run, saved with ``a`` left out."""
    first = repository(tmp_path / "first")
    build(first, "out/c1.txt", "out/d.txt")
    beats = tmp_path / "beats"
    beats.write_text("2026-11-28T22:00:00\n")
    archive = tmp_path / "state.tar.xz"
    manifest = run_state.save(first, archive, ["all"], ["out/a.txt"], [beats], SNAKEMAKE)
    return first, archive, manifest


def test_a_restored_run_goes_on_where_it_was(tmp_path, saved):
    first, archive, manifest = saved
    assert manifest["jobs_left_by_rule"] == {"all": 1, "b": 1, "c": 1}
    # what the jobs to run read: c1 and d (read by all) and a (by b2), rebuilt rather than kept;
    # b1 is read by c1 alone, which has run, so it stays behind
    assert sorted(manifest["files"]) == ["out/c1.txt", "out/d.txt"]
    assert list(manifest["rebuilt"]) == ["out/a.txt"]

    second = clone(first, tmp_path / "second")
    restored = run_state.restore(archive, second, "1", tmp_path / "meta", SNAKEMAKE)
    # d read a, which this clone rebuilt just now: only the restored files' one, later time
    # keeps d from running again
    assert restored["jobs_left_now_by_rule"] == manifest["jobs_left_by_rule"]
    assert restored["changed_in_git"] == []
    assert run_state.report(restored, manifest["commit"]) == 0
    assert not (second / "out" / "b1.txt").exists()
    assert (tmp_path / "meta" / "beats").read_text() == "2026-11-28T22:00:00\n"
    assert not (second / ".run_state.staging").exists()
    build(second)
    assert (second / "out" / "c2.txt").read_text() == "shared\n2\n"
    assert (second / "out" / "c1.txt").read_text() == (first / "out" / "c1.txt").read_text()


def test_without_the_one_later_time_a_restored_job_would_run_again(tmp_path, saved):
    """With the archive's own (older) times, ``a`` rebuilt here is newer than d's output and
    than c1's (b1's missing output counts through it): both finished chains would run again."""
    first, archive, _ = saved
    second = clone(first, tmp_path / "second")
    build(second, "out/a.txt")
    with tarfile.open(archive) as tar:
        tar.extractall(second, filter="data")  # the files with the times they had
    assert rules(second) == ["all", "b", "b", "c", "c", "d"]


def test_a_file_in_git_changed_since_the_save_reruns_what_read_it(tmp_path, saved):
    first, archive, manifest = saved
    second = clone(first, tmp_path / "second")
    (second / "ref.txt").write_text("v2\n")
    git(second, "commit", "-q", "-am", "another reference")
    restored = run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert restored["changed_in_git"] == ["ref.txt"]
    assert restored["jobs_left_now_by_rule"] == {"all": 1, "b": 1, "c": 1, "d": 1}
    assert run_state.report(restored, "another commit") == 0  # the change explains it
    assert run_state.report(restored, manifest["commit"]) == 1  # nothing would


def test_a_run_in_its_own_folder_is_carried_with_its_options(tmp_path):
    first = repository(tmp_path / "first")
    option = ["--config", "run_dir=runs/m"]
    build(first, "out/c1.txt", "out/d.txt", *option)
    archive = tmp_path / "state.tar.xz"
    with pytest.raises(run_state.RunStateError, match="no job has finished in"):
        run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)  # the project's folder: empty
    manifest = run_state.save(
        first, archive, ["all"], ["out/a.txt"], [], SNAKEMAKE, option, "runs/m"
    )
    assert manifest["workdir"] == "runs/m"
    assert sorted(manifest["files"]) == ["runs/m/out/c1.txt", "runs/m/out/d.txt"]
    assert list(manifest["rebuilt"]) == ["runs/m/out/a.txt"]
    second = clone(first, tmp_path / "second")
    restored = run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert restored["jobs_left_now_by_rule"] == {"all": 1, "b": 1, "c": 1}
    assert (second / "runs/m/.snakemake/metadata").is_dir()


def test_a_file_that_rebuilds_differently_stops_the_restore(tmp_path, capsys):
    first = repository(tmp_path / "first", "date +%N")  # not deterministic: a differs each build
    build(first, "out/c1.txt")
    archive = tmp_path / "state.tar.xz"
    assert (
        run_state.main(
            ["save", str(first), str(archive), "--leave-out", "out/a.txt", "--snakemake", SNAKEMAKE]
        )
        == 0
    )
    second = clone(first, tmp_path / "second")
    assert (
        run_state.main(
            ["restore", str(archive), str(second), "--cores", "1", "--snakemake", SNAKEMAKE]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "out/a.txt, rebuilt here, differs from the saved run's" in err
    assert "Nothing was restored" in err
    assert not (second / "out" / "c1.txt").exists()


def test_a_large_file_lies_beside_the_archive_once_under_its_hash(tmp_path):
    """Kept, ``a`` (1.1 MB) goes into ``state.objects/<its SHA-256>``, not into the archive: a
    second save holding it writes no other copy, a save that no longer needs it removes it, and
    a restore puts it in place, or stops, with nothing restored, where it is damaged."""
    first = repository(tmp_path / "first")
    build(first, "out/c1.txt", "out/d.txt")
    archive = tmp_path / "state.tar.xz"
    manifest = run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)
    objects = tmp_path / "state.objects"
    assert run_state.objects_folder(archive) == objects
    digest = run_state.sha256(first / "out" / "a.txt")
    assert manifest["objects"] == {"out/a.txt": digest}
    assert sorted(manifest["files"]) == ["out/c1.txt", "out/d.txt"]
    with tarfile.open(archive) as tar:
        assert "out/a.txt" not in tar.getnames()
    assert [p.name for p in objects.iterdir()] == [digest]
    written = (objects / digest).stat().st_mtime_ns
    run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)
    assert [p.name for p in objects.iterdir()] == [digest]
    assert (objects / digest).stat().st_mtime_ns == written  # not written again

    second = clone(first, tmp_path / "second")
    restored = run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert restored["jobs_left_now_by_rule"] == manifest["jobs_left_by_rule"]
    assert run_state.sha256(second / "out" / "a.txt") == digest
    assert run_state.report(restored, manifest["commit"]) == 0

    (objects / digest).write_bytes(b"damaged")
    third = clone(first, tmp_path / "third")
    with pytest.raises(run_state.RunStateError, match=r"out/a\.txt, is damaged"):
        run_state.restore(archive, third, "1", None, SNAKEMAKE)
    (objects / digest).unlink()
    with pytest.raises(run_state.RunStateError, match=r"out/a\.txt, is missing"):
        run_state.restore(archive, third, "1", None, SNAKEMAKE)
    assert not (third / "out").exists()

    build(first, "out/c2.txt")  # b2 has run: no job left reads a
    assert run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)["objects"] == {}
    assert not objects.exists()


def test_a_large_saved_progress_is_left_out_and_named(tmp_path):
    """A running job's progress changes with every save: one over --progress-max (default 4 MiB)
    stays out of the archive, and the manifest names it (that job starts over)."""
    first = repository(tmp_path / "first")
    build(first, "out/c1.txt")
    small = first / "results" / ".progress" / "small" / "state.pt"
    large = first / "results" / ".progress" / "large" / "state.pt"
    for path, size in ((small, 1000), (large, 5 * 2**20)):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\1" * size)
    archive = tmp_path / "state.tar.xz"
    manifest = run_state.save(first, archive, ["all"], ["out/a.txt"], [], SNAKEMAKE)
    assert manifest["progress_left_out"] == ["results/.progress/large/state.pt"]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "results/.progress/small/state.pt" in names
    assert "results/.progress/large/state.pt" not in names
    manifest = run_state.save(
        first, archive, ["all"], ["out/a.txt"], [], SNAKEMAKE, progress_max_mib=8
    )
    assert manifest["progress_left_out"] == []
    with tarfile.open(archive) as tar:
        assert "results/.progress/large/state.pt" in tar.getnames()


def test_restore_refuses_other_results_and_other_archives(tmp_path, saved):
    first, archive, _ = saved
    second = clone(first, tmp_path / "second")
    (second / "out").mkdir()
    (second / "out" / "c1.txt").write_text("another run's\n")
    with pytest.raises(run_state.RunStateError, match="exists and differs from the saved run's"):
        run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert (second / "out" / "c1.txt").read_text() == "another run's\n"

    foreign = tmp_path / "foreign.tar.xz"
    with tarfile.open(archive) as src, tarfile.open(foreign, "w:xz") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        (tmp_path / "hook").write_text("#!/bin/sh\n")
        dst.add(tmp_path / "hook", arcname=".git/hooks/post-checkout")
    third = clone(first, tmp_path / "third")
    with pytest.raises(run_state.RunStateError, match=r"which run_state\.py does not write"):
        run_state.restore(foreign, third, "1", None, SNAKEMAKE)
    assert not (third / "out").exists()


def test_save_refuses_uncommitted_changes(tmp_path):
    first = repository(tmp_path / "first")
    (first / "ref.txt").write_text("v2\n")
    with pytest.raises(run_state.RunStateError, match="uncommitted changes"):
        run_state.save(first, tmp_path / "state.tar.xz", ["all"], [], [], SNAKEMAKE)
    assert not list(tmp_path.glob("state.tar.xz*"))


SCORED = """
rule all:
    input: "out/report.txt"
rule attack:
    output: rec="results/attacks/r1.pt", victim="results/victims/v1.pt"
    shell: "echo image > {output.rec}; echo private > {output.victim}"
rule score:
    input: "results/attacks/r1.pt", "results/victims/v1.pt"
    output: "results/metrics/s.json"
    shell: \"\"\"echo '{{"runs": [{{"reconstruction": "results/attacks/r1.pt", \\
        "victim_file": "results/victims/v1.pt"}}]}}' > {output}\"\"\"
rule report:
    input: "results/metrics/s.json"
    output: "out/report.txt"
    shell: "cat {input} results/attacks/r1.pt > {output}"
"""


def test_the_files_a_pending_reports_scores_name_are_carried(tmp_path):
    """A table's report reads the reconstructions and victims its score records name without
    declaring them (its grid): with the scores finished and the report to run, they are carried
    (beside the archive, by their SHA-256), and restored without rerunning what made them."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "Snakefile").write_text(SCORED)
    git(first, "init", "-q")
    git(first, "add", "Snakefile")
    git(first, "commit", "-q", "-m", "w")
    build(first, "results/metrics/s.json")
    archive = tmp_path / "state.tar.xz"
    manifest = run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)
    assert manifest["jobs_left_by_rule"] == {"all": 1, "report": 1}
    assert sorted(manifest["files"]) == ["results/metrics/s.json"]
    assert sorted(manifest["objects"]) == ["results/attacks/r1.pt", "results/victims/v1.pt"]

    second = clone(first, tmp_path / "second")
    restored = run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert restored["jobs_left_now_by_rule"] == {"all": 1, "report": 1}  # score not rerun
    assert (second / "results" / "attacks" / "r1.pt").read_text() == "image\n"
    build(second, "all")
    assert "image" in (second / "out" / "report.txt").read_text()
