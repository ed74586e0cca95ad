"""Stage: the utility table, what each defense costs in accuracy, from FL training summaries.

Each input is the summary of one FL training run (``gradinv train``) under one defense, with the
study's FL setting (params.yaml ``utility``). A row gives the defense, its setting, the test
accuracy at the end of training (the mean of the last ``utility.average_last`` evaluations: one
evaluation of a small model trained by FedSGD swings by several points from one to the next) and
that accuracy relative to training without a defense (Refiner's PMM, the
"performance of the model with the defense over the model without"), plus the privacy budget
epsilon for a defense that accounts one (DP-SGD) and the training time per round. A failed
(diverged) run keeps its row, with its reason and no accuracy.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.io import atomic_path, read_json
from gradinv.tables.render import write_csv

COLUMNS = (
    "defense",
    "label",
    "kind",
    "setting",
    "accuracy",
    "accuracy_spread",
    "relative_accuracy",
    "difference",
    "round",
    "epsilon",
    "raw_gradient_rate",
    "fallback_rate",
    "seconds_per_round",
    "status",
    "failure",
    "scale",
)
REFERENCE = "none"  # the row every other is relative to


def run(settings: dict[str, Any], summaries: list[Path], out_dir: Path) -> None:
    runs = [read_json(p) for p in summaries]
    table = utility_table(runs, settings)
    write_csv(table, out_dir / "utility.csv")
    with atomic_path(out_dir / "utility.md") as tmp:
        tmp.write_text(_markdown(table, runs, settings), encoding="utf-8")


def utility_table(runs: list[dict[str, Any]], settings: dict[str, Any]) -> pd.DataFrame:
    """One row per run, in the study's order of defenses."""
    defenses, order = settings["defenses"], settings["utility"]["defenses"]
    last = settings["utility"]["average_last"]
    finals = {s["defense"]: final_accuracy(s, last) for s in runs}
    reference = finals.get(REFERENCE, (None, None))[0]
    spreads = {s["defense"]: accuracy_spread(s, last) for s in runs}
    rows = []
    for s in sorted(runs, key=lambda s: order.index(s["defense"])):
        accuracy, at_round = finals[s["defense"]]
        block = defenses[s["defense"]]
        rounds = max((int(p["round"]) for p in s["history"]), default=0)
        privacy = s.get("privacy") or {}
        rows.append(
            {
                "defense": s["defense"],
                "label": block["label"],
                "kind": block["kind"],
                "setting": describe(block),
                "accuracy": accuracy,
                "accuracy_spread": spreads[s["defense"]],
                "relative_accuracy": None
                if accuracy is None or not reference
                else accuracy / reference,
                "difference": None
                if accuracy is None or reference is None
                else accuracy - reference,
                "round": at_round,
                "epsilon": privacy.get("epsilon"),
                **defense_rates(s),
                "seconds_per_round": s["seconds"] / rounds if rounds else None,
                "status": s["status"],
                "failure": s["failure"] or "",
                "scale": settings["scale"],
            }
        )
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


def describe(block: dict[str, Any]) -> str:
    """A defense's settings as one cell: ``key=value`` pairs, the label and kind left out."""
    return ", ".join(f"{k}={v}" for k, v in block.items() if k not in ("kind", "label", "from"))


def training_metrics(
    runs: list[dict[str, Any]], last: int
) -> dict[str, dict[tuple[str, str, str], tuple[float | None, str]]]:
    """The accuracy (%) and PMM of each run by (dataset, model, defense), each as (value, why it
    is missing or ""), for the tables that show what a defense costs (metrics of scope
    ``training``); PMM is relative to the ``none`` run of the same dataset and model."""
    accuracy = {}
    for s in runs:
        value = final_accuracy(s, last)[0]
        why = "" if value is not None else f"training {s['status']}: {s.get('failure') or ''}"
        accuracy[(s["dataset"], s["model"], s["defense"])] = (value, why)
    pmm = {}
    for (dataset, model, defense), (value, why) in accuracy.items():
        reference, ref_why = accuracy.get(
            (dataset, model, REFERENCE), (None, "no run without defense")
        )
        if value is not None and reference:
            pmm[(dataset, model, defense)] = (value / reference, "")
        else:
            ref_why = ref_why or "0% accuracy"
            pmm[(dataset, model, defense)] = (None, why or f"the run without defense: {ref_why}")
    return {"accuracy": accuracy, "pmm": pmm}


def final_accuracy(summary: dict[str, Any], last: int) -> tuple[float | None, int | None]:
    """Test accuracy (%) of a finished run, the mean of its ``last`` evaluations, and the last
    evaluated round; None if it failed."""
    evals = _last_evaluations(summary, last)
    if summary["status"] != "ok" or not evals:
        return None, None
    mean = sum(float(p["test_accuracy"]) for p in evals) / len(evals)
    return 100.0 * mean, int(evals[-1]["round"])


def _last_evaluations(summary: dict[str, Any], last: int) -> list[dict[str, Any]]:
    return [p for p in summary["history"] if "test_accuracy" in p][-last:]


def defense_rates(summary: dict[str, Any]) -> dict[str, float | None]:
    """Over a whole training run, CENSOR's share of client updates that were the raw gradient
    (``raw_gradient_rate``: Algorithm 1's fallback) and in which no candidate beat the
    undefended loss (``fallback_rate``); None for a defense that counts neither. Per round they
    are in the run's history (and MLflow)."""
    stats = summary.get("defense_stats") or {}
    updates = stats.get("updates")
    if not updates or "fallbacks" not in stats:
        return {"raw_gradient_rate": None, "fallback_rate": None}
    return {
        "raw_gradient_rate": stats.get("raw_shared", 0) / updates,
        "fallback_rate": stats["fallbacks"] / updates,
    }


def accuracy_spread(summary: dict[str, Any], last: int) -> float | None:
    """The sample standard deviation (percentage points) of the ``last`` evaluations that
    :func:`final_accuracy` averages: how far one run's reading moves from one evaluation to the
    next. Two defenses closer than this are not told apart by one run each."""
    evals = [float(p["test_accuracy"]) for p in _last_evaluations(summary, last)]
    if summary["status"] != "ok" or len(evals) < 2:
        return None
    return 100.0 * statistics.stdev(evals)


def _markdown(table: pd.DataFrame, runs: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    study = settings["utility"]
    lines = [f"# {study['title']}", ""]
    if settings["scale"] == "embedded":
        lines += [f"> **SCALED-DOWN run.** {study['scaled_down_note'].strip()}", ""]
    lines += [
        f"Test accuracy (%) after FL training under each defense, the mean of the last "
        f"{study['average_last']} evaluations (every {settings['fl']['eval_every']} rounds), "
        "± their standard deviation: one run's reading moves that much from one evaluation to "
        "the next, so smaller differences between two defenses mean little; "
        "*relative* is the accuracy over the accuracy without a defense (Refiner's PMM); "
        "epsilon is the privacy budget a defense accounts (DP-SGD, at the delta of its setting); "
        "*raw G0* is the share of client updates that were the raw gradient, unprotected "
        "(CENSOR under Algorithm 1: no orthogonal candidate lowered the loss), and *fallback* the "
        "share in which no candidate did (under `never-raw` the best candidate is shared anyway).",
        "",
        "| defense | setting | accuracy | relative | difference | epsilon | raw G0 | fallback "
        "| s/round | failure |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(v: Any, fmt: str) -> str:
        return "" if v is None or pd.isna(v) else format(v, fmt)

    for r in table.to_dict("records"):
        spread = num(r["accuracy_spread"], ".2f")
        lines.append(
            f"| {r['label']} | {r['setting']} | {num(r['accuracy'], '.2f')}"
            f"{' ± ' + spread if spread else ''} | "
            f"{num(r['relative_accuracy'], '.3f')} | {num(r['difference'], '+.2f')} | "
            f"{num(r['epsilon'], '.3g')} | {num(r['raw_gradient_rate'], '.3f')} | "
            f"{num(r['fallback_rate'], '.3f')} | {num(r['seconds_per_round'], '.3f')} | "
            f"{r['failure']} |"
        )
    commits = sorted({str(s.get("git_commit")) for s in runs})
    lines += [
        "",
        "## Setting",
        "",
        f"- dataset: {study['dataset']}, model: {study['model']}",
        f"- partition: {settings['partition']}",
        f"- FL: {settings['fl']}",
        f"- seed: {settings['seed']}, scale: {settings['scale']}",
        f"- git commit(s): {', '.join(commits)}",
        "",
    ]
    return "\n".join(lines)
