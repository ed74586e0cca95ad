"""What every target of ``rule all`` costs: measured at the default scale, estimated at full scale.

    python benchmarks/costs.py [--paper-config workflow/configs/paper.yaml] [--configfile F ...]
        [--measure-iterations [--iterations N] [--repeats R] [--slow S] [--threads T]]
        [--project DIR] [--pauses FILE]
    python benchmarks/costs.py --remaining [--cores N] [--project DIR] [--pauses FILE]
        [--configfile F ...]

``--remaining`` answers "how long until ``all`` finishes here?" for a run under way or stopped:
the jobs a plain dry run still lists, each with its seconds as below (measured where an earlier
run of the same output left a measurement, else the median of the finished jobs of its kind),
and the wall time on ``--cores`` cores at best: the larger of the job-seconds over the cores and
the longest job left. A job that saved progress (``results/.progress``) counts in full.
``--pauses`` (``START END`` a line, as ``benchmarks/run_log.py`` reads it) takes out what the run
spent paused as a whole: a ``benchmark:`` file counts a pause in every job it held (a run paused
an hour for the test suite measures an hour longer), so with ``--pauses`` a finished job's
seconds are its Snakemake record's start to end less the pauses in it. The same holds for the
table of every target: ``--project DIR --pauses FILE`` right after a paused run ends gives its
costs without the pauses.
``--project`` reads another checkout (the one a long run works in) with its own Snakefile; put
that checkout's ``src`` first on ``PYTHONPATH`` (as the run itself must), else its Snakefile is read
with this checkout's ``gradinv`` and a job whose settings differ between the two shows as left.

Jobs. For each configuration (params.yaml, with ``--configfile`` overlays; then params.yaml with
the paper overlay) ``snakemake -n --forceall`` lists every job of the default target ``all``
with its rule, inputs, outputs, benchmark file and wildcards (:func:`jobs.parse_dry_run`; the
job counts are checked against Snakemake's own "Job stats" table). The targets are the inputs of
that ``all`` job, so they come from the Snakefile and the config, never from this script. A
target's jobs are everything it needs from scratch (the producers of its inputs, recursively);
a job several targets need (data preparation, a checkpoint two tables attack) counts in each of
them, and ``exclusive_jobs`` are the jobs no other target needs. The row ``all`` counts every
job once: the marginal total. Costs are job-seconds, the sum over jobs as if they ran one after
another; jobs running side by side finish sooner in wall time.

Default scale, measured. A job's own wall seconds come from its ``benchmark:`` file
(``results/benchmarks/...tsv``, column ``s``, the median of its rows) or else from Snakemake's
record of the job's outputs (``.snakemake/metadata``: the time the job started, when Snakemake
marked its outputs incomplete, to the time its last output was written); both are what the
machine did while it ran the job, with whatever else was running. Both describe the last run of
that output, whatever settings it ran with. A job without a measurement of its own is estimated
by the median of the measured jobs of the same rule with the same wildcards but victim, round and
seed (the same work on other data: a utility run's other seeds of its recipe, model and defense),
else of the same rule, method (the attack of an attack or score job, the defense of a train or
capture job, the generator), dataset, model, batch size and FL recipe, else (a sweep's variant) of
its base defense with the same. A job with none is *unmeasured*: it adds no seconds, and every
cell that leaves it out says so.

Full scale, estimated. Each paper-overlay job's settings are what Snakemake passes it
(:func:`gradinv.jobs.job_settings`); its cost is its count of iterations times the seconds one
iteration of that model, image size and batch took in ``results/benchmarks/iterations.json``
(written by ``--measure-iterations``, on CUDA when present, else the CPU):

- IG, GI: iterations x restarts attack iterations (one forward and the backward of the
  gradient-matching loss); DLG, iDLG, CPL: L-BFGS steps x ``max_iter`` evaluations x restarts
  (an upper bound: L-BFGS may stop early); the restarts as if one after another (an upper bound
  where they run as one vmap pass on a GPU); EOT's samples of the defense's transform not timed.
- GGL: budget x population x restarts candidates, each a generator forward of batch B plus an
  attack iteration (an upper bound: GGL needs no second-order gradient); GIAS: restarts x
  (latent + weight steps); GIFD: restarts x stages x steps, each step a generator forward and
  backward of batch B (the whole generator: an upper bound for the later stages) plus an attack
  iteration. Generators are timed at batch 1 and scaled linearly in B.
- Imprint: analytic, no iterations: not estimated.
- Training (train, train_utility, train_convergence): rounds x clients per round (x local steps
  under FedAvg) client updates with no defense (one forward and backward of a batch, as
  :func:`gradinv.fl.client.client_update` runs it); capture: one such update of the victim's
  batch; client_time: its timed calls plus the untimed one. The defense's own work (CENSOR's
  trials, Refiner's and DCS²'s searches, Soteria's derivatives, DP-SGD's per-sample gradients)
  is not included, nor are the test-set evaluations: ``full_leaves_out`` counts the jobs that
  leave each out.
- Everything else (data, victims, scoring, the official code's central loop, the evaluation
  network, reports) has no per-iteration model here: not estimated, and the cell says which.

``--measure-iterations`` times each unit the paper overlay's jobs use, each model built from the
merged config's block at the dataset's shape and classes with seed 0: an attack iteration as
benchmarks/restarts.py times it (IG, 1 restart, the attack's loop timer, median over
``--repeats`` runs of ``--iterations`` after a 2-iteration warm-up); a client update
(:func:`~gradinv.fl.client.client_update`, FedSGD, no defense, train mode); a generator (random
weights at its real size) forward, and forward plus backward, at batch 1. A call slower than
``--slow`` seconds is timed once. Each unit records the machine's 1-min load average before and
after it: on a shared machine other work inflates the figures. Per-iteration costs measured on a
CPU are labelled as such: an upper bound for a GPU, never a GPU figure.

Writes results/costs.csv and results/costs.md (and, with ``--measure-iterations``,
results/benchmarks/iterations.json), each atomically.

This script is the command line and the table; the modules beside it do the rest: jobs.py (the
dry run's jobs, and each target's), default_scale.py (a job's measured or estimated seconds),
full_scale.py (a full-scale job as iterations x units) and iterations.py (timing those units).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# beside this script, in benchmarks/
from default_scale import METHOD, Cost, default_costs, sweep_base
from full_scale import job_plan, load_config, plan_seconds
from iterations import ITERATIONS_FILE, measure_iterations
from jobs import Dag, Job, dry_run, parse_dry_run, target_jobs
from run_log import read_pauses

ROOT = Path(__file__).resolve().parents[1]
SHOWN_METHODS = 8  # --remaining: the methods of a rule's unmeasured jobs named, most jobs first


# ---------------------------------------------------------------------------- per target
def fmt_seconds(s: float) -> str:
    if s >= 100 * 86400:
        return f"{s / 86400:,.0f} d"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def rule_counts(jobs: Iterable[Job]) -> str:
    counts = sorted(Counter(j.rule for j in jobs).items(), key=lambda rn: (-rn[1], rn[0]))
    return ", ".join(f"{r} {n}" for r, n in counts)


def shortened(rules: str, n: int = 3) -> str:
    """The first ``n`` of "rule count, ..." (the CSV has them all)."""
    parts = rules.split(", ")
    return ", ".join(parts[:n]) + (", ..." if len(parts) > n else "")


def default_rows(dag: Dag, costs: dict[int, Cost]) -> dict[str, dict[str, Any]]:
    """Per target (and ``all``): its jobs, its own jobs, their measured/estimated seconds."""

    def seconds(jobs: list[Job], kinds: tuple[str, ...] = ("measured", "estimated")) -> float:
        return round(sum(costs[j.jobid].seconds for j in jobs if costs[j.jobid].kind in kinds), 1)

    rows = {}
    for target, (jobs, own) in target_jobs(dag).items():
        kinds = Counter(costs[j.jobid].kind for j in jobs)
        unmeasured = [j for j in jobs if costs[j.jobid].seconds is None]
        rows[target] = {
            "target": target,
            "jobs": len(jobs),
            "exclusive_jobs": len(own),
            "measured_jobs": kinds["measured"],
            "estimated_jobs": kinds["estimated"],
            "unmeasured_jobs": len(unmeasured),
            "unmeasured_rules": rule_counts(unmeasured),
            "default_seconds": seconds(jobs) if len(unmeasured) < len(jobs) else None,
            "default_measured_seconds": seconds(jobs, ("measured",)),
            "exclusive_seconds": seconds(own) if any(costs[j.jobid].kind for j in own) else None,
            "exclusive_unmeasured_jobs": sum(costs[j.jobid].seconds is None for j in own),
        }
    return rows


def full_rows(dag: Dag, config: dict, units: dict[str, dict]) -> dict[str, dict[str, Any]]:
    plans = {j.jobid: job_plan(config, j) for j in dag.jobs if j.output}
    seconds = {i: plan_seconds(p, units) for i, p in plans.items()}
    rows = {}
    for target, (jobs, _) in target_jobs(dag).items():
        done = [j for j in jobs if seconds[j.jobid][0] is not None]
        missing = [j for j in jobs if seconds[j.jobid][0] is None]
        left_out = Counter(x for j in done for x in plans[j.jobid].leaves_out)
        reasons = Counter(seconds[j.jobid][1] for j in missing)
        rows[target] = {
            "full_jobs": len(jobs),
            "full_estimated_jobs": len(done),
            "full_seconds": round(sum(seconds[j.jobid][0] for j in done), 1) if done else None,
            "full_unestimated_jobs": len(missing),
            "full_unestimated_rules": rule_counts(missing),
            "full_unestimated_why": "; ".join(f"{r} ({n})" for r, n in reasons.most_common()),
            "full_leaves_out": "; ".join(f"{x} ({n} jobs)" for x, n in left_out.most_common()),
        }
    return rows


def default_cell(row: dict[str, Any]) -> str:
    if "unmeasured_jobs" not in row:
        return "not a target of this configuration"
    n = row["unmeasured_jobs"]
    if row["default_seconds"] is None:
        return f"unmeasured ({n} jobs: {shortened(row['unmeasured_rules'])})"
    text = f"{fmt_seconds(row['default_seconds'])} ({row['measured_jobs']} measured"
    text += f", {row['estimated_jobs']} estimated)" if row["estimated_jobs"] else ")"
    if n:
        text = f"≥ {text}; {n} unmeasured: {shortened(row['unmeasured_rules'])}"
    return text


def full_cell(row: dict[str, Any]) -> str:
    if "full_unestimated_jobs" not in row:
        return "not a target of this configuration"
    n = row["full_unestimated_jobs"]
    if row["full_seconds"] is None:
        return f"not estimated ({n} jobs: {shortened(row['full_unestimated_rules'])})"
    text = f"{fmt_seconds(row['full_seconds'])} ({row['full_estimated_jobs']} jobs)"
    if n:
        text = f"≥ {text}; {n} not estimated: {shortened(row['full_unestimated_rules'])}"
    return text


def device_label(iterations: dict[str, Any] | None) -> str:
    if not iterations:
        return "none: no results/benchmarks/iterations.json (run --measure-iterations)"
    if iterations["device"] == "cpu":
        loads = [x for u in iterations.get("units", []) for x in u.get("load_average", [])]
        busy = f", 1-min load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        return (
            f"CPU ({iterations['device_name']}, {iterations['threads']} threads{busy}): a CPU "
            "measurement, an upper bound for one GPU"
        )
    return f"GPU ({iterations['device_name']})"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    full = {
        "cpu": "full scale, from CPU per-iteration costs (an upper bound for one GPU)",
        "cuda": "full scale, one GPU",
    }.get(meta["iterations_device"], "full scale (no per-iteration costs)")
    lines = [
        "# What each target costs",
        "",
        f"Default scale: {meta['default_config']}, measured in {meta['measured_in']}. "
        f"Full scale: {meta['paper_config']}. "
        f"Per-iteration costs measured on: {meta['device']}. Job-seconds: the sum over a "
        "target's jobs from scratch, shared jobs counted in every target that needs them "
        "(the `all` row counts each once). Written by `python benchmarks/costs.py` "
        f"({meta['written']}); how each figure is made is in its docstring.",
        "",
        f"| target | jobs (only this target's) | default scale, job-seconds | full-scale jobs "
        f"| {full} | left out of the full-scale figure |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"**{r['target']}** (every job once)" if r["target"] == "all" else r["target"]
        lines.append(
            f"| {name} | {r['jobs']} ({r['exclusive_jobs']}) | {default_cell(r)} "
            f"| {r['full_jobs']} | {full_cell(r)} | {r.get('full_leaves_out') or '-'} |"
        )
    lines += ["", f"Per-iteration costs: {meta['device']}."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- what is left
def remaining(full: Dag, left: list[Job], costs: dict[int, Cost], cores: int) -> str:
    """What is left of ``all`` here, per rule, as Markdown: ``left`` are the jobs a plain dry run
    lists, ``costs`` the seconds of every job of the ``--forceall`` dry run ``full``."""
    by_output = {path: job for job in full.jobs for path in job.output}
    rules: dict[str, list[float | None]] = {}
    for job in left:
        if job.output:
            rules.setdefault(job.rule, []).append(costs[by_output[job.output[0]].jobid].seconds)
    known = [s for seconds in rules.values() for s in seconds if s is not None]
    unknown = sum(s is None for seconds in rules.values() for s in seconds)
    total, longest = sum(known), max(known, default=0.0)
    bound = "≥ " if unknown else ""
    lines = [
        f"# What is left of `all` here: {sum(map(len, rules.values()))} jobs",
        "",
        "| rule | jobs | job-seconds | unmeasured jobs |",
        "|---|---|---|---|",
    ]
    for rule, seconds in sorted(rules.items(), key=lambda r: -sum(s or 0 for s in r[1])):
        missing = sum(s is None for s in seconds)
        shown = fmt_seconds(sum(s for s in seconds if s is not None))
        if missing:
            shown = "unmeasured" if missing == len(seconds) else f"≥ {shown}"
        lines.append(f"| {rule} | {len(seconds)} | {shown} | {missing} |")
    lines += [
        "",
        f"Job-seconds left: {bound}{fmt_seconds(total)}; the longest job left: "
        f"{fmt_seconds(longest)}. Wall time on {cores} cores: {bound}"
        f"{fmt_seconds(max(total / cores, longest))} at best.",
    ]
    if unknown:
        lines += ["", "Unmeasured jobs left, by rule and method (a sweep's variant as its base):"]
        methods = unmeasured_methods(left, by_output, costs)
        lines += [f"- {rule}: {counts}" for rule, counts in methods]
    return "\n".join(lines) + "\n"


def unmeasured_methods(
    left: list[Job], by_output: dict[str, Job], costs: dict[int, Cost]
) -> list[tuple[str, str]]:
    """For each rule, its jobs left without seconds counted by method (``refiner 75, none 3``)."""
    counts: dict[str, Counter[str]] = {}
    for job in left:
        if job.output and costs[by_output[job.output[0]].jobid].seconds is None:
            method = job.w.get(METHOD.get(job.rule, ""), "")
            counts.setdefault(job.rule, Counter())[sweep_base(method)] += 1
    out = []
    for rule, c in sorted(counts.items(), key=lambda rc: -rc[1].total()):
        shown = [f"{m} {n}".strip() for m, n in c.most_common(SHOWN_METHODS)]
        rest = c.most_common()[SHOWN_METHODS:]
        if rest:
            shown.append(f"{len(rest)} more {sum(n for _, n in rest)}")
        out.append((rule, ", ".join(shown)))
    return out


# ---------------------------------------------------------------------------- main
def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configfile", nargs="*", default=[], help="overlays of the default scale")
    p.add_argument("--paper-config", default="workflow/configs/paper.yaml")
    p.add_argument("--measure-iterations", action="store_true")
    p.add_argument("--iterations", type=int, default=None, help="default: 5 on CPU, 50 on CUDA")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--slow", type=float, default=5.0, help="a call this slow is timed once")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--remaining", action="store_true", help="what is left of `all` here")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="with --remaining")
    p.add_argument("--project", type=Path, default=ROOT, help="the checkout a run worked in")
    p.add_argument("--pauses", type=Path, help="that run's pauses, START END a line")
    a = p.parse_args()
    os.chdir(ROOT)
    project = a.project.resolve()
    run = project / load_config(a.configfile)["run_dir"]  # where the run's jobs wrote
    pauses = read_pauses(a.pauses)
    if a.remaining:
        full = Dag(parse_dry_run(dry_run(a.configfile, cwd=project)))
        text = dry_run(a.configfile, cwd=project, forceall=False)
        left = [] if "Nothing to be done" in text else parse_dry_run(text)
        print(remaining(full, left, default_costs(full.jobs, run, pauses), a.cores))
        return 0

    default = Dag(parse_dry_run(dry_run(a.configfile, cwd=project)))
    rows = default_rows(default, default_costs(default.jobs, run, pauses))
    paper = Dag(parse_dry_run(dry_run([*a.configfile, a.paper_config], cwd=project)))
    config = load_config([*a.configfile, a.paper_config])
    if a.measure_iterations:
        iterations = measure_iterations(paper, config, a)
    elif (ROOT / ITERATIONS_FILE).is_file():
        iterations = json.loads((ROOT / ITERATIONS_FILE).read_text())
    else:
        iterations = None
    units = {u["key"]: u for u in (iterations or {}).get("units", [])}
    full = full_rows(paper, config, units)
    missing = set(default.targets()) ^ set(paper.targets())
    table = []
    for target in [*default.targets(), *sorted(missing - set(default.targets())), "all"]:
        blank = {"target": target, "jobs": 0, "exclusive_jobs": 0}
        table.append(rows.get(target, blank) | full.get(target, {"full_jobs": 0}))
    meta = {
        "default_config": " + ".join(["params.yaml", *a.configfile]),
        "measured_in": f"{run} (less the pauses in {a.pauses})" if a.pauses else str(run),
        "paper_config": " + ".join(["params.yaml", *a.configfile, a.paper_config]),
        "device": device_label(iterations),
        "iterations_device": (iterations or {}).get("device"),
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_outputs(table, meta)
    print((ROOT / "results/costs.md").read_text())
    return 0


def write_outputs(table: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    from gradinv.io import atomic_path, write_text

    columns = list(dict.fromkeys(k for row in table for k in row))
    with atomic_path(ROOT / "results/costs.csv") as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*columns, "device"])
        writer.writeheader()
        for row in table:
            writer.writerow({**row, "device": meta["device"]})
    write_text(ROOT / "results/costs.md", markdown(table, meta))


if __name__ == "__main__":
    sys.exit(main())
