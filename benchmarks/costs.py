"""What every target of ``rule all`` costs: measured at the default scale, estimated at full scale.

    python benchmarks/costs.py [--paper-config workflow/configs/paper.yaml] [--configfile F ...]
        [--measure-iterations [--iterations N] [--repeats R] [--slow S] [--threads T]]

Jobs. For each configuration (params.yaml, with ``--configfile`` overlays; then params.yaml with
the paper overlay) ``snakemake -n --forceall`` lists every job of the default target ``all``
with its rule, inputs, outputs, benchmark file and wildcards (:func:`parse_dry_run`; the job
counts are checked against Snakemake's own "Job stats" table). The targets are the inputs of
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
by the median of the measured jobs of the same rule with the same wildcards but victim and round
(the same work on other data), else of the same rule, method (the attack of an attack or score
job, the defense of a train or capture job, the generator), dataset, model and batch size. A job
with neither is *unmeasured*: it adds no seconds, and every cell that leaves it out says so.

Full scale, estimated. Each paper-overlay job's settings are what Snakemake passes it
(:func:`gradinv.config.job_settings`); its cost is its count of iterations times the seconds one
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
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS_FILE = Path("results/benchmarks/iterations.json")
# A job's wildcards that only pick other data for the same work.
INSTANCE = ("victim", "round")
# The wildcard naming a job's method, by rule (for the median of measured jobs).
METHOD = {
    "attack": "attack",
    "score": "attack",
    "capture": "defense",
    "capture_malicious": "defense",
    "train": "defense",
    "train_utility": "defense",
    "train_convergence": "defense",
    "train_convergence_official": "defense",
    "client_time": "defense",
    "train_generator": "generator",
}
SHAPE_WILDCARDS = ("dataset", "model", "bs")
RECORD_TOLERANCE = 0.01  # s: a recorded end and the output's modification time agree to this
# The job_settings stage of each rule with a full-scale model (workflow/rules/*.smk `params:`).
STAGE = {
    "attack": "attack",
    "train": "train",
    "train_utility": "utility_train",
    "train_convergence": "convergence_train",
    "capture": "capture",
    "capture_malicious": "capture",
    "client_time": "client_time",
}
# Channels and classes of the full-scale datasets, for a dataset not prepared on this machine
# (data/prepared/<name>.json says it where it is): MNIST grey; FFHQ's 10 age decades; ImageNet's
# 1000 classes; the side is the config's data.sources.<name>.image_size.
KNOWN_DATASETS = {
    "cifar10": (3, 10),
    "cifar100": (3, 100),
    "svhn": (3, 10),
    "mnist": (1, 10),
    "digits": (1, 10),
    "imagenet": (3, 1000),
    "ffhq": (3, 10),
}


# ---------------------------------------------------------------------------- Snakemake's jobs
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


JOB_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) ([A-Za-z_]\w*):\s*$")
JOB_FIELD = re.compile(r"^\s+(\w+): (.*)$")
STATS_ROW = re.compile(r"^([A-Za-z_]\w*)\s+(\d+)$")


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of ``snakemake -n`` output, checked against its "Job stats" table."""
    jobs: list[Job] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            jobs.append(make_job(current))

    for line in text.splitlines():
        header = JOB_HEADER.match(line)
        if header:
            close()
            current = {"rule": header.group(1)}
            continue
        found = JOB_FIELD.match(line) if current is not None else None
        if found:
            current[found.group(1)] = found.group(2).strip()
        elif current is not None and not line.startswith((" ", "\t")):
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


def dry_run(configfiles: Iterable[str] = (), target: str | None = None, cwd: Path = ROOT) -> str:
    """``snakemake -n --forceall`` of ``target`` (default: the Snakefile's default target)."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "--forceall", "--nocolor"]
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


# ---------------------------------------------------------------------------- default scale
@dataclass(frozen=True)
class Cost:
    """A job's seconds and where they come from: ``measured``, ``estimated`` or None (none)."""

    seconds: float | None
    kind: str | None
    how: str


def benchmark_seconds(path: Path) -> float | None:
    """The median ``s`` of a Snakemake benchmark TSV; None if absent, empty or not a number."""
    if not path.is_file():
        return None
    with path.open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    values = []
    for row in rows:
        try:
            value = float(row["s"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            values.append(value)
    return statistics.median(values) if values else None


def record_path(metadata: Path, output: str) -> Path:
    """Where Snakemake keeps an output's record (snakemake.persistence.file._record_path)."""
    name_max = os.pathconf(metadata, "PC_NAME_MAX") if metadata.is_dir() else 255
    b64 = base64.urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i : i + name_max - 1] for i in range(0, len(b64), name_max - 1)]
    return metadata.joinpath(*["@" + p for p in parts[:-1]], parts[-1])


def record_seconds(job: Job, root: Path) -> float | None:
    """Start to end of the job's last completed run, from Snakemake's records of its outputs.

    A record counts only where the output exists with the modification time recorded as the
    job's end: a run that was killed can leave a record whose end is merely the time Snakemake
    gave up (its outputs absent), and an output changed since is no longer that run's."""
    metadata = root / ".snakemake" / "metadata"
    starts, ends = [], []
    for output in job.output:
        path, out = record_path(metadata, output), root / output
        if not path.is_file() or not out.exists():
            return None
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        start, end = rec.get("starttime"), rec.get("endtime")
        if rec.get("incomplete") or rec.get("rule") != job.rule:
            return None
        if not isinstance(start, int | float) or not isinstance(end, int | float):
            return None
        if abs(out.stat().st_mtime - end) > RECORD_TOLERANCE:
            return None
        starts.append(start)
        ends.append(end)
    if not starts or max(ends) < min(starts):
        return None
    return max(ends) - min(starts)


def own_measurement(job: Job, root: Path) -> Cost | None:
    if job.benchmark:
        seconds = benchmark_seconds(root / job.benchmark)
        if seconds is not None:
            return Cost(seconds, "measured", "benchmark file")
    seconds = record_seconds(job, root)
    if seconds is not None:
        return Cost(seconds, "measured", "Snakemake's record of the run")
    return None


def fallback_groups(job: Job) -> list[tuple[str, tuple]]:
    """The groups whose measured median stands in for an unmeasured job, closest first."""
    w = job.w
    same = (job.rule, tuple(sorted((k, v) for k, v in w.items() if k not in INSTANCE)))
    method = METHOD.get(job.rule)
    keep = {*SHAPE_WILDCARDS, method} if method else set(SHAPE_WILDCARDS)
    similar = (job.rule, tuple(sorted((k, v) for k, v in w.items() if k in keep)))
    groups = [("the same settings", same)]
    if method and similar != same:
        groups.append((f"the same {method}", similar))
    return groups


def default_costs(jobs: list[Job], root: Path) -> dict[int, Cost]:
    """Each job's seconds: its own measurement, a median of similar measured jobs, or None."""
    own = {j.jobid: own_measurement(j, root) for j in jobs if j.output}
    pools: dict[tuple, list[float]] = {}
    for job in jobs:
        cost = own.get(job.jobid)
        if cost is not None:
            for _, key in fallback_groups(job):
                pools.setdefault(key, []).append(cost.seconds)
    out: dict[int, Cost] = {}
    for job in jobs:
        if not job.output:
            out[job.jobid] = Cost(0.0, "measured", "no-op (an aggregate rule, no output)")
            continue
        cost = own.get(job.jobid)
        if cost is None:
            for what, key in fallback_groups(job):
                if pools.get(key):
                    n = len(pools[key])
                    cost = Cost(
                        statistics.median(pools[key]),
                        "estimated",
                        f"median of {n} measured {job.rule} job(s) with {what}",
                    )
                    break
        out[job.jobid] = cost or Cost(None, None, f"no measured {job.rule} job")
    return out


# ---------------------------------------------------------------------------- full scale
def load_config(configfiles: Iterable[str]) -> dict[str, Any]:
    from gradinv.config import load

    return load(ROOT / "params.yaml", tuple(ROOT / c for c in configfiles))


def dataset_shape(config: dict[str, Any], dataset: str) -> tuple[tuple[int, int, int], int]:
    """(C, H, W) and classes of ``dataset`` under ``config``."""
    side = int(config["data"]["sources"][dataset]["image_size"])
    manifest = ROOT / config["data"]["prepared_dir"] / f"{dataset}.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if tuple(m["image_shape"][1:]) == (side, side):
            return tuple(m["image_shape"]), len(m["classes"])
    if dataset == "patches":
        return (3, side, side), len(config["data"]["sources"][dataset]["photos"])
    if dataset not in KNOWN_DATASETS:
        raise KeyError(f"the shape of dataset {dataset!r} is unknown: prepare it first")
    channels, classes = KNOWN_DATASETS[dataset]
    return (channels, side, side), classes


def unit_key(kind: str, **fields: Any) -> str:
    return json.dumps({"kind": kind, **fields}, sort_keys=True)


def model_unit(kind: str, config: dict, model: str, dataset: str, batch: int) -> str:
    from gradinv.config import method_settings

    shape, classes = dataset_shape(config, dataset)
    block = config["models"][model]
    return unit_key(
        kind,
        model=block["kind"],
        model_settings=method_settings(block),
        shape=list(shape),
        classes=classes,
        batch=int(batch),
    )


def generator_unit(kind: str, block: dict[str, Any]) -> str:
    from gradinv.generators import GENERATORS

    fields = GENERATORS.get(block["kind"]).Settings.__dataclass_fields__
    return unit_key(
        kind, generator=block["kind"], settings={k: v for k, v in block.items() if k in fields}
    )


@dataclass(frozen=True)
class Plan:
    """A full-scale job: a sum of count x unit (x the blocks of the generator ``per_block``, for
    GIFD's "every stage"), or why it has no estimate; and what it leaves out."""

    terms: tuple[tuple[float, str], ...] = ()
    per_block: str | None = None
    missing: str | None = None  # why not estimated
    leaves_out: tuple[str, ...] = ()


GENERATIVE = ("ggl", "gias", "gifd")
LBFGS = ("dlg", "idlg", "cpl")
ADAM = ("inverting_gradients", "gradinversion")


def attack_plan(config: dict, job: Job, s: dict[str, Any]) -> Plan:
    a, w = s["attack"], job.w
    kind, batch = a["kind"], int(w["bs"])
    step = model_unit("attack_iteration", config, w["model"], w["dataset"], batch)
    out = ("EOT's samples of the defense",) if a.get("eot_samples", 0) else ()
    if kind in ADAM:
        return Plan(((a["iterations"] * a["restarts"], step),), leaves_out=out)
    if kind in LBFGS:
        return Plan(((a["iterations"] * a["max_iter"] * a["restarts"], step),), leaves_out=out)
    if kind in GENERATIVE:
        gen = s["generator"]
        fwd = generator_unit("generator_forward", gen)
        fwd_bwd = generator_unit("generator_forward_backward", gen)
        if kind == "ggl":
            n = a["budget"] * a["population"] * a["restarts"]
            return Plan(((n * batch, fwd), (n, step)), leaves_out=out)
        if kind == "gias":
            n = a["restarts"] * (a["latent_iterations"] + a["param_iterations"])
        else:  # gifd; stages 0: one per block of the generator (measured with it)
            n = a["restarts"] * a["iterations"] * (a["stages"] or 1)
        per_block = fwd_bwd if kind == "gifd" and not a["stages"] else None
        return Plan(((n * batch, fwd_bwd), (n, step)), per_block, leaves_out=out)
    why = "analytic, no iterations to count" if kind == "imprint" else "no per-iteration model"
    return Plan(missing=f"attack {kind}: {why}")


def job_plan(config: dict, job: Job) -> Plan:
    from gradinv.config import job_settings

    stage = STAGE.get(job.rule)
    if stage is None:
        return Plan(missing=f"{job.rule}: no per-iteration model")
    s = json.loads(job_settings(config, stage, **job.w))
    if job.rule == "attack":
        return attack_plan(config, job, s)
    w = job.w
    defended = () if s["defense"]["kind"] == "none" else ("the defense's own work",)
    if job.rule in ("capture", "capture_malicious"):
        unit = model_unit("client_step", config, w["model"], w["dataset"], int(w["bs"]))
        return Plan(((1, unit),), leaves_out=defended)
    if job.rule == "client_time":
        study = s["client_time"]
        unit = model_unit("client_step", config, w["model"], w["dataset"], study["batch_size"])
        return Plan(((study["repeats"] + 1, unit),), leaves_out=defended)
    fl = s["fl"]
    steps = fl["rounds"] * fl["clients_per_round"]
    steps *= fl["local_steps"] if fl["protocol"] == "fedavg" else 1
    unit = model_unit("client_step", config, w["model"], w["dataset"], fl["batch_size"])
    return Plan(((steps, unit),), leaves_out=(*defended, "test-set evaluations"))


def plan_seconds(plan: Plan, units: dict[str, dict]) -> tuple[float | None, str]:
    if plan.missing:
        return None, plan.missing
    for key in {key for _, key in plan.terms}:
        if key not in units:
            return None, f"no per-iteration measurement of {key} (run --measure-iterations)"
    blocks = units[plan.per_block]["num_blocks"] if plan.per_block else 1
    return blocks * sum(count * units[key]["seconds"] for count, key in plan.terms), "estimated"


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
        f"Default scale: {meta['default_config']}. Full scale: {meta['paper_config']}. "
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
            f"| {r['full_jobs']} | {full_cell(r)} | {r['full_leaves_out'] or '-'} |"
        )
    lines += ["", f"Per-iteration costs: {meta['device']}."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- measuring
def timed(fn: Callable[[], object], repeats: int, device: Any, slow: float) -> tuple[float, int]:
    """Median seconds of ``fn`` after an untimed warm-up (timing.median_seconds, except that a
    call slower than ``slow`` seconds is timed once): (seconds, calls timed)."""
    import torch

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warm = once()
    n = 1 if warm > slow else repeats
    return statistics.median(once() for _ in range(n)), n


def measure_unit(key: str, device: Any, iterations: int, repeats: int, slow: float) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from restarts import photo, run_ig

    from gradinv.defenses import build_defense, gradients_of
    from gradinv.fl.client import client_update
    from gradinv.models import build_model
    from gradinv.protocol import ModelSpec, PublicMeta, ServerMessage, SharedUpdate, normalize

    u = json.loads(key)
    out = {"key": key, **u}
    if u["kind"].startswith("generator"):
        from gradinv.generators import GENERATORS
        from gradinv.settings import from_mapping

        cls = GENERATORS.get(u["generator"])
        gen = cls.build(from_mapping(cls.Settings, u["settings"], where="benchmark")).to(device)
        z = torch.randn(1, *gen.latent_shape, device=device)
        labels = torch.tensor([1], device=device) if gen.num_classes else None
        if u["kind"] == "generator_forward":

            def fn() -> object:
                with torch.no_grad():
                    return gen(z, labels)
        else:
            z.requires_grad_(True)

            def fn() -> object:
                gen(z, labels).sum().backward()
                return None

        seconds, n = timed(fn, repeats, device, slow)
        return out | {"seconds": seconds, "timed_calls": n, "num_blocks": gen.num_blocks}
    channels, size, _ = u["shape"]
    spec = ModelSpec(u["model"], u["classes"], channels, size, u["model_settings"])
    batch = u["batch"]
    images = torch.cat([photo(size).roll(7 * i, dims=-1) for i in range(batch)])
    images = images[:, :channels] if channels <= 3 else images
    labels = torch.arange(batch) % u["classes"]
    mean, std = (0.5,) * channels, (0.25,) * channels
    if u["kind"] == "client_step":
        model = build_model(spec, seed=0).to(device).train()
        defense = build_defense("none", {}, where="benchmark")
        inputs, targets = normalize(images, mean, std).to(device), labels.to(device)

        def step() -> object:
            return client_update(
                model,
                inputs,
                targets,
                defense,
                protocol="fedsgd",
                local_steps=1,
                local_lr=0.0,
                generator=torch.Generator().manual_seed(0),
            )

        seconds, n = timed(step, repeats, device, slow)
        return out | {"seconds": seconds, "timed_calls": n}
    # one IG iteration, 1 restart, as benchmarks/restarts.py times it (the attack's loop timer)
    model = build_model(spec, seed=0).eval()
    grads = gradients_of(model, normalize(images, mean, std), labels, F.cross_entropy)
    meta = PublicMeta(
        "benchmark",
        batch,
        (channels, size, size),
        u["classes"],
        mean,
        std,
        "eval",
        "none",
        "none",
        {},
        labels=tuple(labels.tolist()),
    )
    update = SharedUpdate({k: v.detach() for k, v in grads.items()}, "gradient", meta)
    server = ServerMessage(spec, model.state_dict(), 0)
    run_ig(server, update, device, 2, 1, "sequential")  # warm-up
    per_it = []
    for _ in range(repeats):  # restarts.seconds_per_iteration, but a slow run is timed once
        attack, _ = run_ig(server, update, device, iterations, 1, "sequential")
        per_it.append(attack.speed["seconds"] / attack.speed["iterations"])
        if attack.speed["seconds"] > slow:
            break
    return out | {
        "seconds": statistics.median(per_it),
        "iterations": iterations,
        "timed_calls": len(per_it),
    }


def measure_iterations(dag: Dag, config: dict, a: argparse.Namespace) -> dict[str, Any]:
    """Time every per-iteration unit the full-scale jobs need; write iterations.json."""
    import torch

    from gradinv.io import write_json

    torch.set_num_threads(a.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    keys = sorted(
        {key for j in dag.jobs if j.output for _, key in job_plan(config, j).terms},
        key=lambda k: (json.loads(k)["kind"], k),
    )
    iterations = a.iterations or (50 if device.type == "cuda" else 5)
    units = []
    for i, key in enumerate(keys):
        start, load = time.perf_counter(), os.getloadavg()[0]
        u = measure_unit(key, device, iterations, a.repeats, a.slow)
        units.append(u | {"load_average": [load, os.getloadavg()[0]]})
        what = {k: v for k, v in u.items() if k not in ("key", "seconds", "kind")}
        print(
            f"[{i + 1}/{len(keys)}] {u['kind']}: {u['seconds']:.4g} s "
            f"({time.perf_counter() - start:.0f} s to measure) {json.dumps(what)}",
            file=sys.stderr,
        )
    name = torch.cuda.get_device_name() if device.type == "cuda" else cpu_name()
    report = {
        "device": device.type,
        "device_name": name,
        "threads": a.threads,
        "torch": torch.__version__,
        "measured": datetime.now(UTC).isoformat(timespec="seconds"),
        "configs": ["params.yaml", a.paper_config],
        "units": units,
    }
    write_json(ROOT / ITERATIONS_FILE, report)
    return report


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    a = p.parse_args()
    os.chdir(ROOT)

    default = Dag(parse_dry_run(dry_run(a.configfile)))
    rows = default_rows(default, default_costs(default.jobs, ROOT))
    paper = Dag(parse_dry_run(dry_run([*a.configfile, a.paper_config])))
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
