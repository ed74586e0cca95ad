"""How much of ``snakemake all``'s job-time is process start-up, at two commits side by side.

    python benchmarks/startup.py --before REV [--after REV] [--repeats 7]
        [--job-seconds-before S --job-seconds-after S | --benchmarks-before DIR ...]

Every job of the pipeline is a process that starts Python and imports torch and the stage it runs
before it does any work. This script measures that start-up per rule (the median wall time, over
``--repeats`` runs, of a process that imports the rule's stage module and exits, with one thread,
as a job runs) and counts each rule's jobs in ``snakemake -n --forceall all`` at each of two
commits (each checked out in a temporary git worktree and read with its own ``src`` first on
``PYTHONPATH``; the start-up with that commit's code too), both measured in this one run on this
machine, the two commits' processes alternating so that the machine's drift falls on both. The
start-up job-seconds of a commit are the sum over its jobs of their rule's start-up; its share
counts only the jobs with a ``benchmark:`` file, those a measured run's job-seconds sum over (a
rule without one, such as ``select_victim``, counts in neither).

The share needs the job-time of ``all`` at that commit: ``--job-seconds-*`` (the sum of a
measured run's job seconds) or ``--benchmarks-*`` (a measured run's ``results/benchmarks``
folder, whose ``s`` columns are summed). Without them the script prints the start-up
job-seconds and the job counts alone. For a run that stopped and resumed, or was paused, take
the job-seconds from ``benchmarks/run_log.py`` (its ``benchmark:`` files keep each job's last
attempt only and count the pauses).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from jobs import Dag, dry_run, parse_dry_run  # noqa: E402

# The stage module each rule's `gradinv` verb imports (rules that run no process: none).
STAGES = {
    "prepare_data": "gradinv.stages.prepare",
    "partition_data": "gradinv.stages.prepare",
    "partition_convergence": "gradinv.stages.prepare",
    "select_victim": "gradinv.stages.capture",
    "floor": "gradinv.stages.floor",
    "train_generator": "gradinv.stages.generator",
    "fetch_generator": "gradinv.stages.generator",
    "train_evalnet": "gradinv.stages.evalnet",
    "train": "gradinv.stages.train",
    "train_utility": "gradinv.stages.train",
    "train_convergence": "gradinv.stages.train",
    "train_convergence_official": "gradinv.stages.train",
    "capture": "gradinv.stages.capture",
    "capture_malicious": "gradinv.stages.capture",
    "attack": "gradinv.stages.attack",
    "score": "gradinv.stages.score",
    "report": "gradinv.stages.report",
    "report_public": "gradinv.stages.public",
    "report_frontier": "gradinv.stages.frontier",
    "report_convergence": "gradinv.stages.convergence",
    "report_utility": "gradinv.stages.utility",
    "report_utility_recipe": "gradinv.stages.utility",
    "client_time": "gradinv.stages.client_time",
    "report_client_time": "gradinv.stages.client_time",
    "claims": "gradinv.stages.claims",
}


# Rules whose every job builds a torch.optim optimizer (training, a client's update, the
# iterative attacks): the first one imports torch._dynamo (about 1.7 s here), start-up too.
OPTIMIZER_RULES = {
    "train",
    "train_utility",
    "train_convergence",
    "train_convergence_official",
    "train_generator",
    "train_evalnet",
    "capture",
    "capture_malicious",
    "attack",
    "client_time",
}


def startup_seconds(
    module: str, repeats: int, srcs: dict[str, Path], optimizer: bool = False
) -> dict[str, float]:
    """For each side's ``src``, the median wall seconds of a one-thread process that imports
    ``module`` (and, with ``optimizer``, what a job's first torch.optim optimizer imports) and
    exits: a lower bound of what a job spends before its work (Snakemake's own handling of the
    job is not counted). The sides alternate process by process, their order swapped every
    repeat, so that the machine's drift (its caches, another load) falls on both alike."""
    if optimizer:
        module += ", torch._dynamo"
    times: dict[str, list[float]] = {side: [] for side in srcs}
    for i in range(repeats):
        for side in list(srcs)[:: 1 if i % 2 == 0 else -1]:
            env = os.environ | {
                "PYTHONPATH": str(srcs[side]),
                "OMP_NUM_THREADS": "1",
                "MLFLOW_DISABLE_TELEMETRY": "true",
            }
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True)
            times[side].append(time.perf_counter() - start)
    return {side: statistics.median(ts) for side, ts in times.items()}


@dataclass
class Side:
    """One commit's jobs by rule (all of them, and those with a ``benchmark:`` file, the jobs
    a measured run's job-seconds sum over) and each rule's start-up under that commit's code."""

    jobs: dict[str, int]
    benchmarked: dict[str, int]
    startup: dict[str, float]

    def seconds(self, counts: dict[str, int]) -> float:
        return sum(self.startup.get(r, 0.0) * n for r, n in counts.items())


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out in a temporary git worktree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=ROOT, check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True
            )


def job_counts(tree: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The jobs of ``snakemake -n --forceall all`` in ``tree``, read with its own code (its
    ``src`` first on ``PYTHONPATH``), by rule: all of them, and those with a benchmark file."""
    env_src = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree / "src")
    try:
        dag = Dag(parse_dry_run(dry_run(cwd=tree)))
    finally:
        if env_src is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_src
    jobs: dict[str, int] = {}
    benchmarked: dict[str, int] = {}
    for job in dag.jobs:
        jobs[job.rule] = jobs.get(job.rule, 0) + 1
        if job.benchmark:
            benchmarked[job.rule] = benchmarked.get(job.rule, 0) + 1
    return jobs, benchmarked


def measure(revs: dict[str, str], repeats: int) -> dict[str, Side]:
    """Each side's jobs and its rules' start-up under its own code, the sides' processes
    alternating (:func:`startup_seconds`)."""
    with contextlib.ExitStack() as stack:
        trees = {side: stack.enter_context(worktree(rev)) for side, rev in revs.items()}
        counts = {side: job_counts(tree) for side, tree in trees.items()}
        startup: dict[str, dict[str, float]] = {side: {} for side in revs}
        for rule in sorted({r for jobs, _ in counts.values() for r in jobs}):
            srcs = {side: trees[side] / "src" for side in revs if rule in counts[side][0]}
            if rule not in STAGES or not srcs:
                continue
            for side, seconds in startup_seconds(
                STAGES[rule], repeats, srcs, rule in OPTIMIZER_RULES
            ).items():
                startup[side][rule] = seconds
    return {side: Side(*counts[side], startup[side]) for side in revs}


def benchmark_seconds(folder: Path) -> float:
    """The sum of the ``s`` column over a run's benchmark files (each job's median row)."""
    total = 0.0
    for path in folder.rglob("*.tsv"):
        with open(path, newline="") as f:
            rows = [float(r["s"]) for r in csv.DictReader(f, delimiter="\t") if r.get("s")]
        if rows:
            total += statistics.median(rows)
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--repeats", type=int, default=7)
    for side in ("before", "after"):
        parser.add_argument(f"--job-seconds-{side}", type=float)
        parser.add_argument(f"--benchmarks-{side}", type=Path)
    a = parser.parse_args(argv)
    sides = measure({side: getattr(a, side) for side in ("before", "after")}, a.repeats)
    before, after = sides["before"], sides["after"]
    rules = sorted(set(before.jobs) | set(after.jobs))

    def cell(side: Side, r: str) -> str:
        return f"{side.startup[r]:.2f}" if r in side.startup else "none (no process)"

    print(
        "| rule | start-up before (s, median) | start-up after | jobs before | jobs after "
        "| benchmarked before | benchmarked after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rules:
        print(
            f"| {r} | {cell(before, r)} | {cell(after, r)} | {before.jobs.get(r, 0)} | "
            f"{after.jobs.get(r, 0)} | {before.benchmarked.get(r, 0)} | "
            f"{after.benchmarked.get(r, 0)} |"
        )
    for name, side in sides.items():
        total = getattr(a, f"job_seconds_{name}")
        if total is None and getattr(a, f"benchmarks_{name}") is not None:
            total = benchmark_seconds(getattr(a, f"benchmarks_{name}"))
        spent = side.seconds(side.jobs)
        # the share: the start-up of the jobs the job-seconds count (those with a benchmark file)
        measured = side.seconds(side.benchmarked)
        share = (
            f"; the benchmarked jobs' start-up {measured / 3600:.2f} job-hours, "
            f"{100 * measured / total:.1f}% of their {total / 3600:.1f} job-hours"
            if total
            else ""
        )
        print(
            f"{name} ({getattr(a, name)}): {sum(side.jobs.values())} jobs, start-up "
            f"{spent / 3600:.2f} job-hours{share}"
        )


if __name__ == "__main__":
    main()
