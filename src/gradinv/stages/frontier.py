"""Stage: the utility-privacy frontier (``results/frontier.csv`` and ``results/frontier.png``).

Every defense of the ``frontier`` table, at each strength of its sweep, as one point: its utility
(PMM, the accuracy of FL training under it over the accuracy without) against its privacy under
the strongest attack run against it. "Strongest" is taken per privacy metric, from the attacker's
side: the highest PSNR and SSIM, the lowest LPIPS over the table's attacks (plain, transform-aware,
EOT and Ignore), so an adaptive attack that breaks a defense moves its point, as it should. The
attack behind each value is written beside it, and each value's 95% interval (``<m>_ci_low``,
``<m>_ci_high``: PMM's over the training seeds, a privacy metric's over the victims of that
attack's cell), as the table's cells give them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.tables.aggregate import raw_text
from gradinv.tables.figures import draw_tradeoff, figure_caption
from gradinv.tables.render import write_csv

#: The privacy metrics of the frontier and the attacker's preference: the best attack maximizes
#: PSNR and SSIM and minimizes LPIPS.
PRIVACY: dict[str, str] = {"psnr": "max", "ssim": "max", "lpips": "min"}


def run(settings: dict[str, Any], cells_path: Path, out_dir: Path) -> None:
    cells = pd.read_csv(cells_path)
    frontier = frontier_points(cells, settings["sweep_points"], settings["labels"])
    frontier["scale"] = settings["scale"]
    write_csv(frontier, out_dir / "frontier.csv")
    draw(frontier, out_dir / "frontier.png", settings)


def frontier_points(
    cells: pd.DataFrame, sweeps: dict[str, list[Any]], labels: dict[str, str]
) -> pd.DataFrame:
    """One row per (dataset, defense): PMM and, per privacy metric, the strongest attack's mean
    and name. ``sweeps`` maps a swept variant to [base, setting, value]; other defenses are their
    own base, at no setting."""
    rows = []
    for (dataset, defense), group in cells.groupby(["dataset", "defense"], sort=False):
        base, setting, value = sweeps.get(defense, (defense, "", None))
        row: dict[str, Any] = {
            "dataset": dataset,
            "dataset_label": group["dataset_label"].iloc[0],
            "defense": defense,
            "defense_label": group["defense_label"].iloc[0],
            "base": base,
            "base_label": labels.get(base, base),
            "setting": setting,
            "value": value,
            "pmm": _first(group, "pmm"),
            "pmm_ci_low": _first(group, "pmm", "ci_low"),
            "pmm_ci_high": _first(group, "pmm", "ci_high"),
            # CENSOR under Algorithm 1: victims whose captured update was the raw gradient (one
            # capture per victim, whatever the attack)
            "raw_gradient_shared": _raw(group),
        }
        for metric, pick in PRIVACY.items():
            scored = group[(group["metric"] == metric) & (group["n"] > 0)].dropna(subset=["mean"])
            if scored.empty:
                row[metric], row[f"{metric}_attack"] = math.nan, ""
                row[f"{metric}_ci_low"] = row[f"{metric}_ci_high"] = math.nan
                continue
            best = scored.loc[scored["mean"].idxmax() if pick == "max" else scored["mean"].idxmin()]
            row[metric], row[f"{metric}_attack"] = float(best["mean"]), best["attack_label"]
            for end in ("ci_low", "ci_high"):
                row[f"{metric}_{end}"] = float(best[end]) if end in best else math.nan
        rows.append(row)
    return pd.DataFrame.from_records(rows)


def _raw(group: pd.DataFrame) -> str:
    if "raw_recorded" not in group.columns:  # cells written before the count existed
        return ""
    recorded = group[group["raw_recorded"] > 0]
    return raw_text(recorded.iloc[0].to_dict()) if len(recorded) else ""


def _first(group: pd.DataFrame, metric: str, column: str = "mean") -> float:
    if column not in group.columns:
        return math.nan
    values = group.loc[group["metric"] == metric, column].dropna()
    return float(values.iloc[0]) if len(values) else math.nan


def draw(frontier: pd.DataFrame, out: Path, settings: dict[str, Any]) -> None:
    """One panel per privacy metric: PMM on x, the strongest attack's value on y, one line per
    defense through its sweep (in the order of the swept value)."""
    lines = [
        line.sort_values("value", key=_sort_key) for _, line in frontier.groupby("base", sort=False)
    ]
    ordered = pd.concat(lines, ignore_index=True) if lines else frontier
    points = pd.concat(
        [
            ordered.assign(
                facet=ordered["dataset_label"],
                metric=metric,
                attack_label="strongest attack",
                line=ordered["base_label"],
                x=ordered["pmm"],
                x_low=ordered["pmm_ci_low"],
                x_high=ordered["pmm_ci_high"],
                y=ordered[metric],
                y_low=ordered[f"{metric}_ci_low"],
                y_high=ordered[f"{metric}_ci_high"],
                note=f"{metric.upper()} unavailable in this run",
            )
            for metric in PRIVACY
        ],
        ignore_index=True,
    )
    title = "Utility against privacy under the strongest attack"
    draw_tradeoff(
        points,
        out,
        x_label="PMM (accuracy relative to no defense)",
        caption=figure_caption(title, settings["scale"], "frontier_runs.md"),
    )


def _sort_key(values: pd.Series) -> pd.Series:
    """Order a sweep by its value: numbers numerically, anything else as text."""
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers if numbers.notna().all() else values.astype(str)
