"""What each rule asks of the machine: a GPU token locally, and a cluster scheduler's resources.

Every job that takes a device holds one ``gpu`` resource when it may use a GPU (``device`` not
``cpu``, or ``cluster.gpus: true``): locally ``profiles/default`` grants as many as the machine
has, on SLURM the executor plugin turns it into ``--gpus=1``. A rule's memory (``mem_mb``) and time
limit (``runtime``, minutes) come from ``cluster.resources`` (its own block, else ``default``),
its CPUs from ``threads_per_job``: one setting per scale, not numbers typed into each rule, and a
local run ignores them. ``profiles/slurm`` is the SLURM profile; docs/cluster.md says how to run
it.

Where each rule runs on a cluster (:data:`LOCAL_RULES`: on the submit host, the others through the
scheduler) and which rules share a submission (:func:`group`) is decided here, with the reason.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Rules run by the Snakemake process itself, on the submit host: each is seconds of work, so a
# submission (queueing, two Python start-ups on the node) would cost more than the job; and
# downloads need the network, which compute nodes often lack.
LOCAL_RULES: dict[str, str] = {
    "prepare_data": "downloads (compute nodes often have no network); the embedded data: seconds",
    "fetch_generator": "downloads published weights (the network)",
    "partition_data": "seconds: a seeded split of the labels",
    "partition_convergence": "seconds: a seeded split of the labels",
    "partition_recipe": "seconds: a seeded split of the labels",
    "select_victim": "under a second: one batch of the validation split",
    "floor": "seconds: the public split's mean image",
    "score": "seconds: metrics of a cell's reconstructions",
    "report": "seconds: a table from its metric files",
    "report_public": "seconds: a figure from metric files",
    "report_frontier": "seconds: a figure from a table",
    "report_utility": "seconds: a table from training summaries",
    "report_utility_recipe": "seconds: a table from training summaries",
    "report_convergence": "seconds: figures from training summaries",
    "report_client_time": "seconds: a table from timings",
    "claims": "seconds: the claims from the tables",
    "all": "the target",
    "prepared_data": "a target",
    "trained_models": "a target",
    "generators": "a target",
    "evaluation_networks": "a target",
}

# Rules whose job takes a device (gradinv.resources.acquire_device): training, capture, attacks.
DEVICE_RULES = (
    "train",
    "capture",
    "attack",
    "train_utility",
    "train_convergence",
    "train_convergence_official",
    "train_evalnet",
    "train_generator",
    "client_time",
)


# The rules submitted to the scheduler (everything else is in LOCAL_RULES); a `use rule` variant
# has its base rule's resources and group.
REMOTE_RULES = (*DEVICE_RULES,)
VARIANTS = {"capture_malicious": "capture"}


def gpus(config: dict[str, Any]) -> int:
    """The GPUs a device-taking job asks for: ``cluster.gpus`` (auto: one unless device is cpu)."""
    setting = config.get("cluster", {}).get("gpus", "auto")
    if setting == "auto":
        return 0 if config["device"] == "cpu" else 1
    return int(bool(setting))


def resources(config: dict[str, Any], rule: str) -> dict[str, Any]:
    """The resources of ``rule``'s jobs: its ``gpu`` token, and what a scheduler allocates."""
    blocks = config.get("cluster", {}).get("resources", {})
    own = {**blocks.get("default", {}), **blocks.get(rule, {})}
    out: dict[str, Any] = {"cpus_per_task": config["threads_per_job"], **own}
    if rule in DEVICE_RULES:
        out["gpu"] = gpus(config)
    return out


def group(config: dict[str, Any], rule: str) -> str | None:
    """The submission a capture or attack job shares with the rest of its cell.

    With ``cluster.group_cells`` (the embedded scale: each job is seconds) a cell's captures and
    attacks go to the scheduler as one job; at full scale each attack is hours of a GPU and
    grouping would run them one after another in one allocation, so each is its own submission.
    Locally a group changes nothing.
    """
    if rule in ("capture", "attack") and config.get("cluster", {}).get("group_cells", False):
        return "cell"
    return None


# ---------------------------------------------------------------------------------------------
# When SLURM stopped a job: which limit to raise
# ---------------------------------------------------------------------------------------------

# Snakemake's SLURM plugin logs each submission as "... with SLURM jobid 123 (log:
# .../slurm_logs/rule_train/...)" (or group_cell for a group); it reports a failed job by its
# state alone, so the limit behind the state is named here.
_SUBMITTED = re.compile(r"with SLURM jobid (\d+) \(log: [^)]*?/slurm_logs/(?:rule|group)_([\w-]+)/")
_LIMITS = {  # state -> (resource, what SLURM enforced, unit)
    "TIMEOUT": ("runtime", "time limit", "minutes"),
    "OUT_OF_MEMORY": ("mem_mb", "memory limit", "MB"),
}
_RESUME = (
    "Rerun the same command: finished jobs are kept, and a training job resumes from its last "
    "progress file (saved every progress.every_seconds)."
)


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """Each SLURM job's final state from the accounting (``sacct``); {} where it cannot say."""
    try:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "--format=JobID,State"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = (line.split("|") for line in out.splitlines() if "|" in line)
    return {job: state.split()[0] for job, state, *_ in rows}  # "CANCELLED by 0" -> CANCELLED


def explain_slurm_failures(
    log_text: str,
    config: dict[str, Any],
    states: Callable[[list[str]], dict[str, str]] = sacct_states,
) -> list[str]:
    """What to do about each job of this run that SLURM stopped (time, memory, a lost node,
    preemption), from the run's Snakemake log and SLURM's accounting; one message per rule and
    cause. Jobs that failed on their own are left to their logs."""
    submitted = dict(_SUBMITTED.findall(log_text))
    if not submitted:
        return []
    found = states(list(submitted))
    messages: dict[tuple[str, str], str] = {}
    blocks = config.get("cluster", {}).get("resources", {})
    for job, state in found.items():
        what = submitted.get(job)
        if what is None or (what, state) in messages:
            continue
        rule = VARIANTS.get(what, what)
        if state in _LIMITS:
            key, limit, unit = _LIMITS[state]
            if what == "cell":  # a group: one submission for a cell's captures and attacks
                now = {r: resources(config, r).get(key) for r in ("capture", "attack")}
                setting = " and ".join(f"cluster.resources.{r}.{key}" for r in now)
                held = ", ".join(f"{r} {v} {unit}" for r, v in now.items())
                name = "a cell's captures and attacks (one submission: cluster.group_cells)"
            else:
                setting = f"cluster.resources.{rule}.{key}"
                source = rule if key in blocks.get(rule, {}) else "default"
                held = f"{resources(config, rule).get(key)} {unit} (cluster.resources.{source})"
                name = rule
            messages[(what, state)] = (
                f"SLURM stopped {name} (SLURM job {job}, state {state}) at its {limit}: {key} "
                f"was {held}. Raise {setting} in params.yaml or your --configfile overlay. "
                f"{_RESUME}"
            )
        elif state in ("NODE_FAIL", "PREEMPTED", "BOOT_FAIL"):
            messages[(what, state)] = (
                f"{rule} (SLURM job {job}) ended with state {state}: its node failed or the job "
                f"was preempted, not the job itself. {_RESUME} With --slurm-requeue SLURM puts "
                "such jobs back in the queue by itself."
            )
    return list(messages.values())


def report_slurm_failures(
    logs: Sequence[str | Path] | None,
    config: dict[str, Any],
    states: Callable[[list[str]], dict[str, str]] = sacct_states,
) -> None:
    """Print :func:`explain_slurm_failures` for the run whose Snakemake log files are ``logs``
    (the Snakefile's ``onerror``: Snakemake 9 passes the list of its log files)."""
    text = "".join(Path(f).read_text(errors="replace") for f in logs or () if Path(f).exists())
    for message in explain_slurm_failures(text, config, states):
        print(f"gradinv: {message}", file=sys.stderr)
