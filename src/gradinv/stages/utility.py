"""Stage: the utility table, what each defense costs in accuracy, from FL training summaries.

Each input is the summary of one FL training run (``gradinv train``) under one defense at one
seed, with the study's FL setting (params.yaml ``utility``). Every defense runs at the same seeds
(``utility.seeds``), and at one seed every defense starts from the same model and sees the same
clients and batches, so two defenses are compared seed by seed.

A run's accuracy is the mean of its last ``utility.average_last`` evaluations (one evaluation of a
small model trained by FedSGD swings by several points from one to the next). Over the seeds:

- ``results/utility_runs.csv``: one line per run (defense, seed, accuracy, status, ...), what the
  accuracy claims pair seed by seed (:mod:`gradinv.claims`);
- ``results/utility.csv`` and ``.md``: one line per defense, its mean accuracy over the seeds
  with a 95% t-interval, its PMM (Refiner's "performance of the model with the defense over the
  model without": the accuracy over no defense's at the same seed, averaged over the seeds, with
  its interval) and its difference to no defense (paired by seed, with its interval), the privacy
  budget epsilon of a defense that accounts one (DP-SGD), CENSOR's raw-gradient share and the
  training time per round.

A failed (diverged) run keeps its line with its reason and no accuracy; a defense's line counts
its failed seeds, and its statistics are over the seeds that finished.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.io import atomic_path, read_json
from gradinv.stages.summary import accuracy_spread, defense_rates, final_accuracy
from gradinv.stats import mean_over_seeds, paired_seeds
from gradinv.tables.html import write_markdown_page
from gradinv.tables.render import write_csv

RUN_COLUMNS = (
    "defense",
    "label",
    "seed",
    "accuracy",
    "accuracy_spread",
    "relative_accuracy",
    "round",
    "epsilon",
    "raw_gradient_rate",
    "fallback_rate",
    "seconds_per_round",
    "status",
    "failure",
    "scale",
)
COLUMNS = (
    "defense",
    "label",
    "kind",
    "setting",
    "accuracy",
    "accuracy_ci_low",
    "accuracy_ci_high",
    "seeds",
    "failed_seeds",
    "paired_seeds",
    "relative_accuracy",
    "relative_ci_low",
    "relative_ci_high",
    "difference",
    "difference_ci_low",
    "difference_ci_high",
    "epsilon",
    "raw_gradient_rate",
    "fallback_rate",
    "seconds_per_round",
    "status",
    "failure",
    "scale",
)
REFERENCE = "none"  # the row every other is relative to


def run(
    settings: dict[str, Any], summaries: list[Path], out_dir: Path, name: str = "utility"
) -> None:
    """Write ``<name>.csv``, ``<name>_runs.csv`` and ``<name>.md`` (``utility``, or
    ``utility_<recipe>`` for a paper's recipe)."""
    runs = [read_json(p) for p in summaries]
    per_run = run_table(runs, settings)
    table = utility_table(runs, settings)
    write_csv(per_run, out_dir / f"{name}_runs.csv")
    write_csv(table, out_dir / f"{name}.csv")
    text = _markdown(table, runs, settings)
    with atomic_path(out_dir / f"{name}.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    write_markdown_page(out_dir / f"{name}.html", title=name, markdown_text=text)


def run_table(runs: list[dict[str, Any]], settings: dict[str, Any]) -> pd.DataFrame:
    """One line per training run, in the study's order of defenses, then by seed."""
    order, last = settings["utility"]["defenses"], settings["utility"]["average_last"]
    rows = []
    for s in sorted(runs, key=lambda s: (order.index(s["defense"]), int(s.get("seed", 0)))):
        accuracy, at_round = final_accuracy(s, last)
        rounds = max((int(p["round"]) for p in s["history"]), default=0)
        rows.append(
            {
                "defense": s["defense"],
                "label": settings["defenses"][s["defense"]]["label"],
                "seed": int(s.get("seed", 0)),
                "accuracy": accuracy,
                "accuracy_spread": accuracy_spread(s, last),
                "round": at_round,
                "epsilon": (s.get("privacy") or {}).get("epsilon"),
                **defense_rates(s),
                "seconds_per_round": s["seconds"] / rounds if rounds else None,
                "status": s["status"],
                "failure": s["failure"] or "",
                "scale": settings["scale"],
            }
        )
    table = pd.DataFrame.from_records(rows, columns=list(RUN_COLUMNS))
    # PMM run by run: the accuracy over no defense's at the same seed
    reference = table[table["defense"] == REFERENCE].set_index("seed")["accuracy"]
    table["relative_accuracy"] = [
        a / reference[s] if s in reference.index and _finite(a) and reference[s] else None
        for a, s in zip(table["accuracy"], table["seed"], strict=True)
    ]
    return table


def utility_table(runs: list[dict[str, Any]], settings: dict[str, Any]) -> pd.DataFrame:
    """One line per defense, in the study's order: its accuracy over the seeds, and its PMM and
    difference to no defense paired by seed, each with its 95% interval."""
    per_run = run_table(runs, settings)
    by_seed = {
        d: dict(zip(g["seed"], g["accuracy"], strict=True)) for d, g in per_run.groupby("defense")
    }
    reference = by_seed.get(REFERENCE, {})
    rows = []
    for defense in dict.fromkeys(per_run["defense"]):
        lines = per_run[per_run["defense"] == defense]
        ok = lines[lines["status"] == "ok"].dropna(subset=["accuracy"])
        block = settings["defenses"][defense]
        accuracy = mean_over_seeds(ok["accuracy"].tolist())
        relative, difference = _paired_to_reference(by_seed[defense], reference)
        failed = lines[lines["status"] != "ok"]
        rows.append(
            {
                "defense": defense,
                "label": block["label"],
                "kind": block["kind"],
                "setting": describe(block),
                "accuracy": _value(accuracy.estimate),
                "accuracy_ci_low": _value(accuracy.low),
                "accuracy_ci_high": _value(accuracy.high),
                "seeds": len(ok),
                "failed_seeds": len(failed),
                "paired_seeds": relative.n,  # the seeds no defense finished too
                "relative_accuracy": _value(relative.estimate),
                "relative_ci_low": _value(relative.low),
                "relative_ci_high": _value(relative.high),
                "difference": _value(difference.estimate),
                "difference_ci_low": _value(difference.low),
                "difference_ci_high": _value(difference.high),
                "epsilon": _mean(lines["epsilon"]),
                "raw_gradient_rate": _mean(lines["raw_gradient_rate"]),
                "fallback_rate": _mean(lines["fallback_rate"]),
                "seconds_per_round": _mean(lines["seconds_per_round"]),
                "status": "ok" if failed.empty else f"{len(failed)} of {len(lines)} seeds failed",
                "failure": "; ".join(
                    f"seed {r.seed}: {r.failure}" for r in failed.itertuples() if r.failure
                ),
                "scale": settings["scale"],
            }
        )
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


def _paired_to_reference(
    accuracies: dict[int, float | None], reference: dict[int, float | None]
) -> tuple[Any, Any]:
    """PMM (accuracy / the reference's at the same seed) and the difference to the reference,
    over the seeds both finished, each with its 95% interval."""
    seeds = [
        s
        for s in accuracies
        if _finite(accuracies[s]) and _finite(reference.get(s)) and reference[s] > 0
    ]
    left = [accuracies[s] for s in seeds]
    right = [reference[s] for s in seeds]
    ratio = mean_over_seeds([a / b for a, b in zip(left, right, strict=True)])
    return ratio, paired_seeds(left, right)


def describe(block: dict[str, Any]) -> str:
    """A defense's settings as one cell: ``key=value`` pairs, the label and kind left out."""
    return ", ".join(f"{k}={v}" for k, v in block.items() if k not in ("kind", "label", "from"))


def training_metrics(
    runs: list[dict[str, Any]], last: int
) -> dict[str, dict[tuple[str, str, str], tuple[dict[int, float], str]]]:
    """The accuracy (%) and PMM of each (dataset, model, defense) over its seeds, as ({seed:
    value} of the seeds that finished, why some are missing or ""), for the tables that show
    what a defense costs (metrics of scope ``training``); PMM is the accuracy over the ``none``
    run's of the same dataset, model and seed."""
    by_key: dict[tuple[str, str, str], dict[int, float | None]] = {}
    why: dict[tuple[str, str, str], list[str]] = {}
    for s in runs:
        key = (s["dataset"], s["model"], s["defense"])
        value = final_accuracy(s, last)[0]
        by_key.setdefault(key, {})[int(s.get("seed", 0))] = value
        if value is None:
            why.setdefault(key, []).append(
                f"training {s['status']} (seed {s.get('seed', 0)}): {s.get('failure') or ''}"
            )
    accuracy, pmm = {}, {}
    for key, seeds in by_key.items():
        done = {s: v for s, v in seeds.items() if v is not None}
        accuracy[key] = (done, "; ".join(why.get(key, [])))
        reference = by_key.get((key[0], key[1], REFERENCE), {})
        done_here = [s for s in sorted(seeds) if seeds[s] is not None]
        paired = [s for s in done_here if reference.get(s) not in (None, 0)]
        ratios = {s: seeds[s] / reference[s] for s in paired}
        # a seed this defense finished and the run without defense did not: no PMM at that seed
        unpaired = [
            f"training without defense {_unfinished(reference.get(s))} (seed {s}): no PMM at "
            "this seed"
            for s in done_here
            if s not in ratios
        ]
        missing = "" if ratios or unpaired else "no finished run without defense at the same seed"
        pmm[key] = (ratios, "; ".join(filter(None, [*why.get(key, []), *unpaired, missing])))
    return {"accuracy": accuracy, "pmm": pmm}


def _unfinished(accuracy: float | None) -> str:
    """Why a run without defense gives no reference accuracy at its seed."""
    return "reached accuracy 0" if accuracy == 0 else "did not finish"


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _value(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def _mean(values: pd.Series) -> float | None:
    known = pd.to_numeric(values, errors="coerce").dropna()
    return float(known.mean()) if len(known) else None


def _interval_text(value: Any, low: Any, high: Any, fmt: str) -> str:
    if value is None or pd.isna(value):
        return ""
    text = format(value, fmt)
    if low is not None and high is not None and not (pd.isna(low) or pd.isna(high)):
        text += f" [{format(low, fmt)}, {format(high, fmt)}]"
    return text


def _markdown(table: pd.DataFrame, runs: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    study = settings["utility"]
    lines = [f"# {study['title']}", ""]
    if settings["scale"] == "embedded":
        lines += [f"> **SCALED-DOWN run.** {study['scaled_down_note'].strip()}", ""]
    recipe = study.get("recipe")
    lines += (
        [f"Recipe: **{recipe['label']}**, as {recipe['source']}.", ""]
        if recipe
        else [
            "Recipe: the common one (`utility.fl`), the same FedSGD setting for every defense; "
            "each paper's own recipe has its table (`utility_<recipe>.md`).",
            "",
        ]
    )
    seeds = ", ".join(map(str, study["seeds"]))
    lines += [
        f"Test accuracy (%) after FL training under each defense, over the seeds {seeds} (the "
        "same for every defense; at one seed every defense starts from the same model and sees "
        "the same clients and batches). A run's accuracy is the mean of its last "
        f"{study['average_last']} evaluations (every {settings['fl']['eval_every']} rounds). In "
        "brackets, 95% intervals: over the seeds (t) for the accuracy; paired by seed for "
        "*relative* (the accuracy over no defense's at the same seed: Refiner's PMM) and for the "
        "difference to no defense, which rest on the seeds both finished (*seeds*: `k paired` "
        "where that is fewer than the defense's own). Each run: `utility_runs.csv`. epsilon is "
        "the privacy budget a defense accounts (DP-SGD, at the delta of its setting); *raw G0* "
        "is the share of client updates that were the raw gradient, unprotected (CENSOR under "
        "Algorithm 1: no orthogonal candidate lowered the loss), and *fallback* the share in "
        "which no candidate did (under `never-raw` the best candidate is shared anyway).",
        "",
        "| defense | setting | accuracy | relative | difference | seeds | epsilon | raw G0 | "
        "fallback | s/round | failure |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(v: Any, fmt: str) -> str:
        return "" if v is None or pd.isna(v) else format(v, fmt)

    for r in table.to_dict("records"):
        failed = f" ({r['failed_seeds']} failed)" if r["failed_seeds"] else ""
        if r["paired_seeds"] < r["seeds"]:  # relative and difference rest on fewer seeds
            failed += f", {r['paired_seeds']} paired"
        cells = [
            r["label"],
            r["setting"],
            _interval_text(r["accuracy"], r["accuracy_ci_low"], r["accuracy_ci_high"], ".2f"),
            _interval_text(
                r["relative_accuracy"], r["relative_ci_low"], r["relative_ci_high"], ".3f"
            ),
            _interval_text(
                r["difference"], r["difference_ci_low"], r["difference_ci_high"], "+.2f"
            ),
            f"{r['seeds']}{failed}",
            num(r["epsilon"], ".3g"),
            num(r["raw_gradient_rate"], ".3f"),
            num(r["fallback_rate"], ".3f"),
            num(r["seconds_per_round"], ".3f"),
            r["failure"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    commits = sorted({str(s.get("git_commit")) for s in runs})
    lines += [
        "",
        "## Setting",
        "",
        f"- dataset: {study['dataset']}, model: {study['model']}",
        f"- partition: {settings['partition']}",
        f"- FL: {settings['fl']}",
        f"- seeds: {seeds}, scale: {settings['scale']}",
        f"- git commit(s): {', '.join(commits)}",
        "",
    ]
    return "\n".join(lines)
