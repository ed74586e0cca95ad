"""Snakemake's jobs, for benchmarks/costs.py: a dry run read into jobs, and each target's jobs.

``snakemake -n --forceall`` prints every job with its rule, inputs, outputs, benchmark file and
wildcards: :func:`parse_dry_run` reads them and checks their count against Snakemake's own "Job
stats" table. :class:`Dag` knows who needs whom, and :func:`target_jobs` gives each target the
jobs it needs from scratch and those no other target needs (the "Jobs." paragraph of costs.py's
docstring).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    """One job of a dry run: what Snakemake prints for it."""

    jobid: int
    rule: str
    output: tuple[str, ...] = ()
    input: tuple[str, ...] = ()
    benchmark: str | None = None
    wildcards: tuple[tuple[str, str], ...] = ()

    @property
    def w(self) -> dict[str, str]:
        return dict(self.wildcards)


# A job inside a group (cluster.group_cells: a cell's captures and attacks) is printed indented
# under its group's line, its fields indented once more.
JOB_HEADER = re.compile(r"^(\s*)(?:local)?(?:rule|checkpoint) ([A-Za-z_]\w*):\s*$")
JOB_FIELD = re.compile(r"^\s+(\w+): (.*)$")
STATS_ROW = re.compile(r"^([A-Za-z_]\w*)\s+(\d+)$")


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of ``snakemake -n`` output, checked against its "Job stats" table."""
    jobs: list[Job] = []
    current: dict[str, Any] | None = None
    indent = ""  # the current job's header's

    def close() -> None:
        if current is not None:
            jobs.append(make_job(current))

    for line in text.splitlines():
        header = JOB_HEADER.match(line)
        if header:
            close()
            indent, current = header.group(1), {"rule": header.group(2)}
            continue
        found = JOB_FIELD.match(line) if current is not None else None
        if found and len(line) - len(line.lstrip()) > len(indent):
            current[found.group(1)] = found.group(2).strip()
        elif current is not None and not line.startswith((indent + " ", indent + "\t")):
            close()  # a timestamp, the stats table: the job's block has ended
            current = None
    close()
    expected = job_stats(text)
    found = Counter(j.rule for j in jobs)
    if expected is None or expected != found:
        raise ValueError(
            f"the dry run's jobs {dict(found)} do not match its Job stats {expected}: the "
            "output format of this Snakemake is not the one this parser reads"
        )
    return jobs


def make_job(block: dict[str, Any]) -> Job:
    def paths(key: str) -> tuple[str, ...]:
        return tuple(p for p in block.get(key, "").split(", ") if p)

    pairs = [pair.split("=", 1) for pair in block.get("wildcards", "").split(", ") if pair]
    if "jobid" not in block:
        raise ValueError(f"a job of rule {block['rule']} has no jobid in the dry run")
    return Job(
        jobid=int(block["jobid"]),
        rule=block["rule"],
        output=paths("output"),
        input=paths("input"),
        benchmark=block.get("benchmark") or None,
        wildcards=tuple((k, v) for k, v in pairs),
    )


def job_stats(text: str) -> Counter[str] | None:
    """The first "Job stats" table of a dry run, rule -> count (without the total)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Job stats:")
    except StopIteration:
        return None
    counts: Counter[str] = Counter()
    for line in lines[start + 3 :]:  # "job  count", "---  ---"
        row = STATS_ROW.match(line.strip())
        if not row:
            break
        if row.group(1) != "total":
            counts[row.group(1)] = int(row.group(2))
    return counts


def dry_run(
    configfiles: Iterable[str] = (),
    target: str | None = None,
    cwd: Path = ROOT,
    forceall: bool = True,
) -> str:
    """``snakemake -n --forceall`` of ``target`` (default: the Snakefile's default target);
    without ``forceall``, only the jobs still to run here."""
    # --nolock: a dry run writes nothing, and may look at a run under way
    cmd = [sys.executable, "-m", "snakemake", "-n", "--nolock", "--nocolor"]
    cmd += ["--forceall"] if forceall else []
    cmd += [target] if target else []
    configfiles = list(configfiles)
    if configfiles:
        cmd += ["--configfile", *configfiles]
    env = os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{text[-3000:]}")
    return text


@dataclass
class Dag:
    """The jobs of one dry run and who needs whom."""

    jobs: list[Job]
    producer: dict[str, Job] = field(init=False)  # output path -> the job that writes it
    by_id: dict[int, Job] = field(init=False)

    def __post_init__(self) -> None:
        self.producer = {o: j for j in self.jobs for o in j.output}
        self.by_id = {j.jobid: j for j in self.jobs}

    def root(self) -> Job:
        """The requested target's job (jobid 0 in Snakemake's numbering)."""
        return self.by_id[0]

    def targets(self) -> list[str]:
        """What the dry run was asked for: the inputs of an aggregate rule (``all``), else its
        output."""
        root = self.root()
        return list(root.input if not root.output else root.output[:1])

    def needs(self, path: str) -> set[int]:
        """The jobids a file needs from scratch: its producer and everything that feeds it."""
        todo = [self.producer[path]] if path in self.producer else []
        seen: set[int] = set()
        while todo:
            job = todo.pop()
            if job.jobid in seen:
                continue
            seen.add(job.jobid)
            todo += [self.producer[p] for p in job.input if p in self.producer]
        return seen


def target_jobs(dag: Dag) -> dict[str, tuple[list[Job], list[Job]]]:
    """Per target, and ``all``: the jobs it needs from scratch, and those of them that are its
    own: no other target needs them, except targets built on this one (claims.md reads the
    tables, so a table's jobs are still the table's own)."""
    needs = {t: dag.needs(t) for t in dag.targets()}
    out = {}
    for target, ids in needs.items():
        mine = dag.producer[target].jobid if target in dag.producer else None
        others = set().union(
            set(), *(other for t, other in needs.items() if t != target and mine not in other)
        )
        jobs = [dag.by_id[i] for i in sorted(ids) if dag.by_id[i].output]
        out[target] = (jobs, [j for j in jobs if j.jobid not in others])
    every = [dag.by_id[i] for i in sorted(set().union(*needs.values())) if dag.by_id[i].output]
    out["all"] = (every, every)
    return out
