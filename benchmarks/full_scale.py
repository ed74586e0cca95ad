"""A job's cost at full scale, for benchmarks/costs.py: its iterations x a measured unit.

:func:`job_plan` reads a paper-overlay job's settings (what Snakemake passes it,
:func:`gradinv.jobs.job_settings`) into a :class:`Plan`: a sum of count x unit, each unit a key
of results/benchmarks/iterations.json (an attack iteration, a client update or a generator pass,
at the job's model, image size and batch), or why the job has no estimate. :func:`plan_seconds`
prices a plan with the measured units (the "Full scale, estimated." paragraph of costs.py's
docstring; iterations.py measures the units).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from jobs import Job  # benchmarks/jobs.py, beside this script

ROOT = Path(__file__).resolve().parents[1]

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


def load_config(configfiles: Iterable[str]) -> dict[str, Any]:
    from gradinv.config import load

    return load(ROOT / "params.yaml", tuple(ROOT / c for c in configfiles))


def dataset_shape(config: dict[str, Any], dataset: str) -> tuple[tuple[int, int, int], int]:
    """(C, H, W) and classes of ``dataset`` under ``config``."""
    side = int(config["data"]["sources"][dataset]["image_size"])
    manifest = ROOT / "data" / "prepared" / f"{dataset}.json"
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
    """An attack job: its victims (first to last), one after another."""
    plan = victim_attack_plan(config, job, s)
    victims = int(job.w["last"]) - int(job.w["first"]) + 1
    return replace(plan, terms=tuple((n * victims, u) for n, u in plan.terms))


def victim_attack_plan(config: dict, job: Job, s: dict[str, Any]) -> Plan:
    """One victim's attack."""
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
    from gradinv.jobs import job_settings

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
