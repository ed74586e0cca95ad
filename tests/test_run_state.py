"""benchmarks/run_state.py: a run saved half-way on one machine and restored in a fresh clone on
another goes on where it was, with nothing finished run again; a left-out file that does not
rebuild the same stops the restore before anything is restored.

The workflow is a small one of the same shape as gradinv's: a shared input (``a``, rebuilt
cheaply, like the prepared dataset), per-victim chains (``b{i}`` then ``c{i}``, like a capture
and its attack) and a job that reads the shared input directly (``d``, like a utility run). ``a`` is over 1 MB,
as the prepared dataset is: Snakemake compares smaller inputs by content, larger ones by time."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
run_state = importlib.import_module("run_state")
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")

WORKFLOW = """
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
    input: "out/a.txt"
    output: "out/d.txt"
    shell: "wc -c < {{input}} > {{output}}"
"""


def clone(path: Path, a_command: str = "echo shared") -> Path:
    """A git checkout of the workflow at ``path`` (what a fresh clone of a run folder is)."""
    path.mkdir()
    (path / "Snakefile").write_text(WORKFLOW.format(A=a_command))
    for args in (
        ["init", "-q"],
        ["add", "Snakefile"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "w"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


def build(run: Path, *targets: str) -> None:
    subprocess.run([SNAKEMAKE, *targets, "--cores", "1"], cwd=run, check=True, capture_output=True)


def test_a_restored_run_goes_on_where_it_was(tmp_path):
    first = clone(tmp_path / "first")
    build(first, "out/c1.txt", "out/d.txt")  # c1 and d finished; b2, c2 and all to run
    heartbeats = tmp_path / "beats"
    heartbeats.write_text("2026-11-28T22:00:00\n")
    archive = tmp_path / "state.tar.xz"
    saved = run_state.save(first, archive, ["all"], ["out/a.txt"], [heartbeats], SNAKEMAKE)
    assert saved["jobs_left"] == 3
    assert saved["jobs_left_by_rule"] == {"all": 1, "b": 1, "c": 1}
    # what the jobs to run read: c1 and d (read by all) and a (by b2), rebuilt rather than kept;
    # b1 is read by c1 alone, which has run, so it stays behind
    assert sorted(saved["files"]) == ["out/c1.txt", "out/d.txt"]
    assert list(saved["rebuilt"]) == ["out/a.txt"]

    second = clone(tmp_path / "second")
    restored = run_state.restore(archive, second, "1", tmp_path / "meta", SNAKEMAKE)
    # d read a, which this clone rebuilt just now: only the restored files' one, later time
    # keeps d from running again
    assert restored["jobs_left_now"] == 3
    assert restored["jobs_left_now_by_rule"] == saved["jobs_left_by_rule"]
    assert not (second / "out" / "b1.txt").exists()
    assert (tmp_path / "meta" / "beats").read_text() == heartbeats.read_text()
    assert not (second / ".run_state.staging").exists()
    build(second)
    assert (second / "out" / "c2.txt").read_text() == "shared\n2\n"
    assert (second / "out" / "c1.txt").read_text() == (first / "out" / "c1.txt").read_text()


def test_a_file_that_rebuilds_differently_stops_the_restore(tmp_path, capsys):
    first = clone(tmp_path / "first", "date +%N")  # not deterministic: a differs each build
    build(first, "out/c1.txt")
    archive = tmp_path / "state.tar.xz"
    assert (
        run_state.main(
            ["save", str(first), str(archive), "--leave-out", "out/a.txt", "--snakemake", SNAKEMAKE]
        )
        == 0
    )
    second = clone(tmp_path / "second", "date +%N")
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


def test_restore_refuses_to_overwrite_other_results(tmp_path):
    first = clone(tmp_path / "first")
    build(first, "out/c1.txt")
    archive = tmp_path / "state.tar.xz"
    run_state.save(first, archive, ["all"], [], [], SNAKEMAKE)
    second = clone(tmp_path / "second")
    (second / "out").mkdir()
    (second / "out" / "c1.txt").write_text("another run's\n")
    with pytest.raises(run_state.RunStateError, match="exists and differs from the saved run's"):
        run_state.restore(archive, second, "1", None, SNAKEMAKE)
    assert (second / "out" / "c1.txt").read_text() == "another run's\n"


def test_without_the_one_later_time_a_restored_job_would_run_again(tmp_path):
    """Why the restore gives its files one time later than the rebuilt ones: with the archive's
    own (older) times, ``a`` rebuilt here is newer than d's output and than c1's (b1's missing
    output counts through it), so both finished chains would run again."""
    first = clone(tmp_path / "first")
    build(first, "out/c1.txt", "out/d.txt")
    archive = tmp_path / "state.tar.xz"
    run_state.save(first, archive, ["all"], ["out/a.txt"], [], SNAKEMAKE)
    second = clone(tmp_path / "second")
    build(second, "out/a.txt")
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(second, filter="data")  # the files with the times they had
    jobs = run_state.jobs_left(SNAKEMAKE, second, ["all"])
    assert sorted(j["rule"][0] for j in jobs) == ["all", "b", "b", "c", "c", "d"]
