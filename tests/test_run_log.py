"""benchmarks/run_log.py: a run stopped and resumed, read from its Snakemake logs. A job stopped
with its invocation and run again counts both attempts; a pause counts in neither the wall time
nor any job; a stopped invocation ends at its last heartbeat (not at the next one's wrapper's
first), or at its last time stamp as a lower bound; a failed job counts to its error."""

import csv
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
run_log = importlib.import_module("run_log")


def stamp(clock: str) -> str:
    """Snakemake's time stamp for 2026-11-27 at ``clock`` (HH:MM:SS)."""
    return f"[Fri Nov 27 {clock} 2026]"


def start(clock: str, rule: str, jobid: int, output: str) -> str:
    return (
        f"{stamp(clock)}\nrule {rule}:\n    input: data/x.pt\n    output: {output}, {output}.json\n"
        f"    jobid: {jobid}\n    reason: Missing output files: {output}\n"
        f"    resources: tmpdir=/tmp\n"
    )


def header(clock: str) -> str:
    return f"SNAKEMAKE\n=========\n  Date: 2026-11-27 {clock}\n\nBuilding DAG of jobs...\n"


# Invocation 1 starts job A (train) and job C (a short score), finishes C, and is stopped
# under A; invocation 2 starts A again (its saved progress) and B, pauses 10 minutes (SIGSTOP)
# while both run, B fails, A finishes, and all is done.
FIRST = (
    header("10:00:00")
    + start("10:00:10", "train", 5, "results/a.pt")
    + start("10:00:10", "score", 6, "results/c.json")
    + f"{stamp('10:00:20')}\nFinished jobid: 6 (Rule: score)\n1 of 3 steps (33%) done\n"
)
SECOND = (
    header("11:00:00")
    + start("11:00:05", "train", 2, "results/a.pt")
    + start("11:00:05", "attack", 3, "results/b.pt")
    + f"{stamp('11:20:05')}\nError in rule attack:\n    message: None\n    jobid: 3\n"
    "    output: results/b.pt\n"
    + f"{stamp('11:30:05')}\nFinished jobid: 2 (Rule: train)\n2 of 3 steps (67%) done\n"
    + "3 of 3 steps (100%) done\n"
    + f"{stamp('11:30:06')}\nFinished jobid: 0 (Rule: all)\n"
)
# A heartbeat a minute while invocation 1 runs (the last at 10:40), then the beat invocation 2's
# wrapper writes a second before it starts.
BEATS = [f"2026-11-27T10:{m:02d}:00Z" for m in range(0, 41)] + ["2026-11-27T10:59:59Z"]
PAUSE = "2026-11-27T11:05:05 2026-11-27T11:15:05  # make test\n"


def attempts(tmp_path, *args):
    out = tmp_path / "attempts.csv"
    run_log.main([*map(str, args), "--csv", str(out)])
    return list(csv.DictReader(out.open()))


@pytest.fixture
def run(tmp_path):
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "2026-11-27T100000.snakemake.log").write_text(FIRST)
    (logs / "2026-11-27T110000.snakemake.log").write_text(SECOND)
    (tmp_path / "beats").write_text("\n".join(BEATS) + "\n")
    (tmp_path / "pauses").write_text("# the run stopped for the tests\n" + PAUSE)
    return tmp_path, sorted(logs.iterdir())


def test_a_resumed_job_counts_both_attempts_less_the_pauses(run, capsys):
    tmp_path, logs = run
    rows = attempts(
        tmp_path, *logs, "--heartbeats", tmp_path / "beats", "--pauses", tmp_path / "pauses"
    )
    got = {(r["job"], r["outcome"]): int(r["seconds"]) for r in rows}
    assert got == {
        ("results/a.pt", "stopped"): 40 * 60 - 10,  # 10:00:10 to the last beat, 10:40:00
        ("results/c.json", "finished"): 10,
        ("results/a.pt", "finished"): 30 * 60 - 10 * 60,  # 11:00:05-11:30:05, less the pause
        ("results/b.pt", "failed"): 20 * 60 - 10 * 60,  # to its error, less the pause
    }
    out = capsys.readouterr().out
    # invocation 1: 10:00:00-10:40:00; invocation 2: 11:00:00-11:30:06 less 10 min
    assert "Wall time: 1 h 00 min (3606 s) over 2 invocations" in out
    assert f"Job-time: {2390 + 10 + 1200 + 600} s" in out
    assert "| train | 1 | 2 | 1 | 0 | 3590 s | 2390 s |" in out
    assert "lower bound" not in out


def test_one_file_holding_both_invocations_reads_the_same(run, capsys):
    """Snakemake's output of both, one after the other, without the ``Date:`` headers: each
    invocation opens at "Building DAG of jobs..." and starts at its first time stamp."""
    tmp_path, _ = run
    both = tmp_path / "all.log"
    text = FIRST + SECOND
    both.write_text("\n".join(line for line in text.splitlines() if "Date:" not in line))
    rows = attempts(
        tmp_path, both, "--heartbeats", tmp_path / "beats", "--pauses", tmp_path / "pauses"
    )
    assert sorted(int(r["seconds"]) for r in rows) == [10, 600, 1200, 2390]
    # 10:00:10-10:40:00, and 11:00:05-11:30:06 less the pause
    assert "Wall time: 0 h 59 min (3591 s) over 2 invocations" in capsys.readouterr().out


def test_without_heartbeats_a_stopped_invocation_is_a_lower_bound(run, capsys):
    tmp_path, logs = run
    rows = attempts(tmp_path, *logs)
    stopped = [r for r in rows if r["outcome"] == "stopped"]
    assert [int(r["seconds"]) for r in stopped] == [10]  # to its log's last time stamp
    out = capsys.readouterr().out
    assert "its log's last time stamp: stopped; a lower bound" in out
    assert "are lower bounds" in out


def test_the_next_wrappers_first_beat_does_not_extend_the_last_invocation(run, capsys):
    tmp_path, logs = run
    (tmp_path / "beats").write_text("2026-11-27T10:59:59Z\n")  # only the wrapper's beat
    rows = attempts(tmp_path, *logs, "--heartbeats", tmp_path / "beats")
    assert [int(r["seconds"]) for r in rows if r["outcome"] == "stopped"] == [10]


def test_a_bad_pause_or_a_missing_log_names_the_problem(run):
    tmp_path, logs = run
    (tmp_path / "pauses").write_text("2026-11-27T11:05:05\n")
    with pytest.raises(SystemExit, match=r"pauses:1: expected 'START END'"):
        run_log.main([*map(str, logs), "--pauses", str(tmp_path / "pauses")])
    (tmp_path / "pauses").write_text("11:05 11:15\n")
    with pytest.raises(SystemExit, match="pauses:1: '11:05' is not an ISO 8601 time"):
        run_log.main([*map(str, logs), "--pauses", str(tmp_path / "pauses")])
    (tmp_path / "pauses").write_text("2026-11-27T11:05:05 2026-11-27T11:00:00\n")
    with pytest.raises(SystemExit, match="ends before it starts"):
        run_log.main([*map(str, logs), "--pauses", str(tmp_path / "pauses")])
    with pytest.raises(SystemExit, match=r"no such file: .*nothing\.log"):
        run_log.main([str(tmp_path / "nothing.log")])
    (tmp_path / "empty.log").write_text("Building DAG of jobs...\nNothing to be done.\n")
    with pytest.raises(SystemExit, match="no job starts in these logs"):
        run_log.main([str(tmp_path / "empty.log")])


def test_kinds_sum_a_jobs_attempts_and_group_by_the_named_groups(run, capsys):
    """A job's kind is its output's named groups; its seconds are all its attempts; a failed or
    unfinished job is left out; an expression without a named group is refused."""
    tmp_path, logs = run
    args = [*map(str, logs), "--heartbeats", str(tmp_path / "beats")]
    args += ["--pauses", str(tmp_path / "pauses")]
    run_log.main([*args, "--kinds", r"results/(?P<name>\w)"])
    out = capsys.readouterr().out
    assert "| name | seconds a job (median) | range | n |" in out
    assert "| a | 3590 | 3590-3590 | 1 |" in out  # 2390 s stopped + 1200 s finished
    assert "| c | 10 | 10-10 | 1 |" in out
    assert "| b |" not in out  # failed
    assert "2 finished jobs of 2 kinds." in out
    assert "Not in the table" not in out
    run_log.main([*args, "--kinds", r"results/(?P<name>\w)", "--kinds-from", "11"])
    out = capsys.readouterr().out
    assert "| a | 3590 |" in out and "| c |" not in out
    assert "under 11 s a job: 1 kind, 1 job, medians 10-10 s, jobs 10-10 s." in out
    with pytest.raises(SystemExit, match="--kinds-from needs --kinds"):
        run_log.main([*args, "--kinds-from", "11"])
    with pytest.raises(SystemExit, match="no named group"):
        run_log.main([*args, "--kinds", r"results/\w"])
    with pytest.raises(SystemExit, match="not a regular expression"):
        run_log.main([*args, "--kinds", r"(?P<x"])


def test_the_utility_kinds_read_recipe_model_and_defense():
    m = re.compile(run_log.KINDS["utility"]).search(
        "results/utility/cvb/patches/vit/cvb_resnet18/seed2/final.pt"
    )
    assert m and m.groupdict() == {"recipe": "cvb", "model": "vit", "defense": "cvb_resnet18"}
