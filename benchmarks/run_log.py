"""What a long run cost, read from its Snakemake logs: its wall time, segment by segment, and
each job's time over all its attempts.

    python benchmarks/run_log.py LOG [LOG ...] [--heartbeats FILE] [--pauses FILE] [--csv OUT]
                                 [--kinds utility|REGEX [--kinds-from SECONDS]]

A run that stops and resumes (a machine's session ends, a laptop sleeps, a cluster job is
preempted) is several Snakemake invocations of the same target. Each writes a log
(``.snakemake/log/*.snakemake.log``, one per invocation; the captured output of several, one
after another, works too) with a time stamp before every job it starts, finishes or loses.
Two things the ``benchmark:`` files cannot tell come out of them:

- a job stopped by the end of its invocation and started again by the next one ran twice; its
  ``benchmark:`` file records the last attempt only, while the run spent both;
- a pause of the whole run (``kill -STOP``, to run something else on the machine) counts, in
  the ``s`` of every job it held, time in which no job ran.

So each attempt's time is its start to its finish (or error), or to its invocation's end where
the invocation stopped under it, less the pauses it spans; a job's time is the sum over its
attempts, and a run's job-time the sum over its jobs (as the ``benchmark:`` files' ``s`` sum,
for ``benchmarks/startup.py --job-seconds-after``). The wall time is each invocation's start
(its log's ``Date:``) to its end, less the pauses in it, summed; the time between invocations
is not counted. For a run under way, its running jobs count to its last heartbeat, as stopped.
A job is read from the block Snakemake logs when it starts (``rule NAME:`` with its ``jobid``
and ``output``; a rule with a ``message:`` logs none and is not counted).

An invocation that was stopped writes nothing at its end: its end is its last heartbeat
(``--heartbeats``: a file of ISO 8601 times written by a loop that lives and dies with the
run, a minute apart, say; those within ``--heartbeat-lead`` before the next invocation's start
are that one's, its wrapper starting), or, without one, the last time stamp in its log (then the
figures are a lower bound, and the output says so). ``--pauses`` holds one pause a line,
``START END`` in ISO 8601. Every time is read on the log's clock (the machine's local time).

``--kinds`` adds a table of the finished jobs by kind: a regular expression searched in each
job's output, its named groups the kind (``utility``: the FL utility runs,
``results/utility/RECIPE/DATA/MODEL/DEFENSE/seedK/``, by recipe, model and defense), each kind's
median seconds a job (its attempts summed), their range and how many; ``--kinds-from S`` keeps the
table to the kinds of S seconds a job or more (the median) and sums up the others in one line.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
DATE = re.compile(r"^\s*Date: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$|^Finished job (\d+)\.$")
ERROR = re.compile(r"^Error in rule (\w+):$")
FIELD = re.compile(r"^ {4}(\w+): (.*)$")
COMPLETE = re.compile(r"^\d+ of \d+ steps \(100%\) done$")
KINDS = {
    "utility": r"^results/utility/(?P<recipe>[^/]+)/[^/]+/(?P<model>[^/]+)/(?P<defense>[^/]+)/seed"
}


@dataclass
class Attempt:
    """One run of one job within one invocation."""

    rule: str
    job: str  # the job's first output: the same job across invocations
    start: datetime
    end: datetime | None = None
    outcome: str = "stopped"  # finished | failed | stopped (its invocation ended, or is running)
    seconds: float = 0.0  # end - start, less the pauses in it


@dataclass
class Invocation:
    path: str
    start: datetime | None = None
    last: datetime | None = None  # the last time stamp in its log
    complete: bool = False  # it reached "N of N steps (100%) done"
    attempts: list[Attempt] = field(default_factory=list)
    end: datetime | None = None
    end_source: str = ""
    paused: timedelta = timedelta()
    wall: timedelta = timedelta()  # end - start - paused


def parse_stamp(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")


def iso(text: str, path: Path, line: int) -> datetime:
    """An ISO 8601 time, with or without a trailing Z (read on the log's clock)."""
    try:
        return datetime.fromisoformat(text.strip().removesuffix("Z"))
    except ValueError:
        raise SystemExit(
            f"{path}:{line}: {text!r} is not an ISO 8601 time (2026-11-27T10:00:00)"
        ) from None


def read_invocations(paths: list[Path]) -> list[Invocation]:
    """Each invocation in ``paths`` (a file may hold several, each opening with a ``Date:``
    header or Snakemake's "Building DAG of jobs..."), with the attempts it started."""
    invocations: list[Invocation] = []
    for path in paths:
        lines = path.read_text(errors="replace").splitlines()
        current: Invocation | None = None
        stamp: datetime | None = None
        by_id: dict[str, Attempt] = {}
        for n, line in enumerate(lines):
            date = DATE.match(line)
            opens = date or line.startswith("Building DAG of jobs")
            if current is None or (opens and (current.last is not None or current.attempts)):
                current, by_id = Invocation(str(path)), {}
                invocations.append(current)
            if date and current.start is None:
                current.start = datetime.fromisoformat(date.group(1))
            elif m := STAMP.match(line):
                stamp = parse_stamp(m.group(1))
                current.last = stamp
                current.start = current.start or stamp
            elif stamp is not None and (m := START.match(line) or ERROR.match(line)):
                fields = block(lines, n + 1)
                jobid = fields.get("jobid", "")
                if line.startswith("Error in rule"):
                    if jobid in by_id and by_id[jobid].end is None:
                        by_id[jobid].end, by_id[jobid].outcome = stamp, "failed"
                elif "output" in fields:  # a job of rule all has none
                    job = fields["output"].split(",")[0].strip()
                    by_id[jobid] = Attempt(m.group(1), job, stamp)
                    current.attempts.append(by_id[jobid])
            elif stamp is not None and (m := FINISHED.match(line)):
                attempt = by_id.get(m.group(1) or m.group(3))
                if attempt is not None and attempt.end is None:
                    attempt.end, attempt.outcome = stamp, "finished"
            elif COMPLETE.match(line):
                current.complete = True
    return [i for i in invocations if i.attempts]


def block(lines: list[str], first: int) -> dict[str, str]:
    """The indented ``key: value`` lines from ``lines[first]`` on (a job's description)."""
    fields: dict[str, str] = {}
    for line in lines[first:]:
        m = FIELD.match(line)
        if not m:
            break
        fields.setdefault(m.group(1), m.group(2))
    return fields


def read_times(path: Path | None) -> list[datetime]:
    """One ISO 8601 time a line; blank lines and ``#`` comments skipped."""
    if path is None:
        return []
    times = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if line:
            times.append(iso(line, path, n))
    return sorted(times)


def read_pauses(path: Path | None) -> list[tuple[datetime, datetime]]:
    """``START END`` a line (ISO 8601); blank lines and ``#`` comments skipped."""
    if path is None:
        return []
    pauses = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SystemExit(f"{path}:{n}: expected 'START END' (ISO 8601), got {line!r}")
        start, end = iso(parts[0], path, n), iso(parts[1], path, n)
        if end < start:
            raise SystemExit(f"{path}:{n}: the pause ends before it starts: {line!r}")
        pauses.append((start, end))
    return pauses


def paused(start: datetime, end: datetime, pauses: list[tuple[datetime, datetime]]) -> timedelta:
    """How much of [start, end] lies in a pause."""
    total = timedelta()
    for a, b in pauses:
        lo, hi = max(start, a), min(end, b)
        if hi > lo:
            total += hi - lo
    return total


def settle(invocations: list[Invocation], heartbeats: list[datetime], lead: timedelta) -> None:
    """Each invocation's end: its last time stamp if it completed or no job ran on after it;
    else its last heartbeat after that stamp and more than ``lead`` before the next invocation
    starts (the next one's wrapper beats just before it); else, with no such heartbeat, its
    last time stamp (a lower bound)."""
    for i, inv in enumerate(invocations):
        assert inv.start is not None and inv.last is not None
        following = invocations[i + 1].start if i + 1 < len(invocations) else None
        beats = [
            b for b in heartbeats if b > inv.last and (following is None or b < following - lead)
        ]
        running = any(a.end is None for a in inv.attempts)
        if inv.complete or not running:
            inv.end, inv.end_source = inv.last, "its log's last time stamp"
        elif beats:
            inv.end, inv.end_source = beats[-1], "its last heartbeat: stopped"
        else:
            inv.end, inv.end_source = inv.last, "its log's last time stamp: stopped; a lower bound"
        for a in inv.attempts:
            if a.end is None:
                a.end = inv.end


def measure(invocations: list[Invocation], pauses: list[tuple[datetime, datetime]]) -> None:
    """Each invocation's wall time and each attempt's seconds, less the pauses in them."""
    for inv in invocations:
        assert inv.start is not None and inv.end is not None
        inv.paused = paused(inv.start, inv.end, pauses)
        inv.wall = inv.end - inv.start - inv.paused
        for x in inv.attempts:
            assert x.end is not None
            x.seconds = (x.end - x.start - paused(x.start, x.end, pauses)).total_seconds()


def hours(t: timedelta) -> str:
    seconds = t.total_seconds()
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def report(invocations: list[Invocation]) -> None:
    """The invocations, the wall time, each rule's job-time (Markdown)."""
    print("| invocation | start | end (from) | paused | wall time | finished | stopped | failed |")
    print("|---|---|---|---|---|---:|---:|---:|")
    for n, inv in enumerate(invocations, 1):
        assert inv.start is not None and inv.end is not None
        count = Counter(x.outcome for x in inv.attempts)
        print(
            f"| {n} | {inv.start:%Y-%m-%d %H:%M:%S} | {inv.end:%Y-%m-%d %H:%M:%S} "
            f"({inv.end_source}) | {hours(inv.paused)} | {hours(inv.wall)} | "
            f"{count['finished']} | {count['stopped']} | {count['failed']} |"
        )
    wall = sum((inv.wall for inv in invocations), timedelta())
    print(
        f"\nWall time: {hours(wall)} ({wall.total_seconds():.0f} s) over {len(invocations)} "
        "invocations, pauses and the time between invocations not counted."
    )

    attempts = [x for inv in invocations for x in inv.attempts]
    rules = sorted(
        {x.rule for x in attempts}, key=lambda r: -sum(x.seconds for x in attempts if x.rule == r)
    )
    print("\n| rule | finished | attempts | stopped | failed | job-time | in unfinished attempts |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rule in rules:
        mine = [x for x in attempts if x.rule == rule]
        count = Counter(x.outcome for x in mine)
        lost = sum(x.seconds for x in mine if x.outcome != "finished")
        print(
            f"| {rule} | {count['finished']} | {len(mine)} | {count['stopped']} | "
            f"{count['failed']} | {sum(x.seconds for x in mine):.0f} s | {lost:.0f} s |"
        )
    total = sum(x.seconds for x in attempts)
    finished = {x.job for x in attempts if x.outcome == "finished"}
    print(
        f"\nJob-time: {total:.0f} s ({total / 3600:.2f} job-hours) over {len(attempts)} attempts "
        f"of {len({x.job for x in attempts})} jobs, {len(finished)} of them finished."
    )
    if any("lower bound" in inv.end_source for inv in invocations):
        print(
            "An invocation stopped with no heartbeat after its last time stamp: the wall time "
            "and the job-time are lower bounds."
        )


def report_kinds(
    invocations: list[Invocation], pattern: re.Pattern[str], shortest: float = 0.0
) -> None:
    """The finished jobs whose output matches ``pattern``, by its named groups (Markdown): each
    kind's median seconds a job (the job's attempts summed), their range, how many; slowest
    first; the kinds whose median is under ``shortest`` seconds in one line after the table."""
    seconds: defaultdict[str, float] = defaultdict(float)
    finished = set()
    for x in (x for inv in invocations for x in inv.attempts):
        seconds[x.job] += x.seconds
        if x.outcome == "finished":
            finished.add(x.job)
    kinds: defaultdict[tuple[str, ...], list[float]] = defaultdict(list)
    for job in finished:
        if m := pattern.search(job):
            kinds[tuple(v or "" for v in m.groupdict().values())].append(seconds[job])
    names = list(pattern.groupindex)
    print(f"\n| {' | '.join(names)} | seconds a job (median) | range | n |")
    print(f"|{'---|' * len(names)}---:|---|---:|")
    rest: list[list[float]] = []
    for kind, times in sorted(kinds.items(), key=lambda kv: (-statistics.median(kv[1]), kv[0])):
        if statistics.median(times) < shortest:
            rest.append(times)
            continue
        print(
            f"| {' | '.join(kind)} | {statistics.median(times):.0f} | "
            f"{min(times):.0f}-{max(times):.0f} | {len(times)} |"
        )
    print(f"\n{sum(map(len, kinds.values()))} finished jobs of {len(kinds)} kinds.")
    if rest:
        medians, every = [statistics.median(t) for t in rest], [x for t in rest for x in t]
        print(
            f"Not in the table, under {shortest:g} s a job: {plural(len(rest), 'kind')}, "
            f"{plural(len(every), 'job')}, "
            f"medians {min(medians):.0f}-{max(medians):.0f} s, jobs {min(every):.0f}-"
            f"{max(every):.0f} s."
        )


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def write_csv(invocations: list[Invocation], path: Path) -> None:
    """Every attempt, a row (written whole, then renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rule", "job", "start", "end", "outcome", "seconds"])
        for inv in invocations:
            for x in inv.attempts:
                end = x.end.isoformat() if x.end else ""
                w.writerow([x.rule, x.job, x.start.isoformat(), end, x.outcome, f"{x.seconds:.0f}"])
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="Snakemake logs, oldest first")
    parser.add_argument("--heartbeats", type=Path, help="ISO 8601 times the run was alive")
    parser.add_argument(
        "--heartbeat-lead",
        type=float,
        default=60,
        help="a heartbeat this close before an invocation starts is its own (default 60 s)",
    )
    parser.add_argument("--pauses", type=Path, help="'START END' a line: the run stopped")
    parser.add_argument("--csv", type=Path, help="write each attempt here")
    parser.add_argument(
        "--kinds",
        metavar="utility|REGEX",
        help="also the finished jobs by kind: a regular expression with named groups, searched "
        "in each job's output ('utility': the FL utility runs by recipe, model and defense)",
    )
    parser.add_argument(
        "--kinds-from",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --kinds: a row for each kind whose median is at least this; the others summed "
        "up in one line (default 0: every kind)",
    )
    a = parser.parse_args(argv)
    if a.kinds_from and not a.kinds:
        raise SystemExit("run_log: --kinds-from needs --kinds (utility, or a regular expression)")
    kinds = None
    if a.kinds:
        try:
            kinds = re.compile(KINDS.get(a.kinds, a.kinds))
        except re.error as e:
            raise SystemExit(
                f"run_log: --kinds {a.kinds!r} is not a regular expression: {e}"
            ) from None
        if not kinds.groupindex:
            raise SystemExit(
                f"run_log: --kinds {a.kinds!r} has no named group to say the kind; "
                "write one as (?P<name>...), or give 'utility'"
            )
    missing = [str(p) for p in [*a.logs, a.heartbeats, a.pauses] if p and not p.is_file()]
    if missing:
        raise SystemExit(f"run_log: no such file: {', '.join(missing)}")
    invocations = sorted(read_invocations(a.logs), key=lambda i: i.start or datetime.min)
    if not invocations:
        raise SystemExit(
            "run_log: no job starts in these logs; give Snakemake's logs of the run "
            "(.snakemake/log/*.snakemake.log)."
        )
    settle(invocations, read_times(a.heartbeats), timedelta(seconds=a.heartbeat_lead))
    measure(invocations, read_pauses(a.pauses))
    report(invocations)
    if kinds:
        report_kinds(invocations, kinds, a.kinds_from)
    if a.csv:
        write_csv(invocations, a.csv)


if __name__ == "__main__":
    sys.exit(main())
