"""Render one named table (CSV, Markdown, comparison with the paper, figure) from metrics files.

This is the single entry point the report stage calls, once per paper table ("table1" for
CENSOR's Table I; later Tables II, V, VI, VII and other papers' tables reuse it with other
``rows``, attacks, defenses and references). Everything it writes is a function of the metrics
files and the arguments alone, with fixed float formatting, so a rerun is byte-identical.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.io import atomic_path, write_text
from gradinv.tables.aggregate import TableError, long_table, widen
from gradinv.tables.compare import empty_comparison, vs_paper
from gradinv.tables.figures import figure_caption, sweep_figure, table_figure, tradeoff_figure
from gradinv.tables.files import (
    DEFAULT_METRICS,
    JOB_KEYS,
    SEED_COLUMNS,
    VICTIM_COLUMNS,
    collect,
    floor_column,
    unavailable_column,
)
from gradinv.tables.floor import undefended_checks
from gradinv.tables.html import write_table_page
from gradinv.tables.markdown import render_markdown

FLOAT_FORMAT = "%.6g"  # 6 significant digits: more than the paper prints, stable across reruns


@dataclass(frozen=True)
class Sweep:
    """The x axis of a swept table: ``column`` of the long table, its positions, the axis label."""

    column: str
    values: Mapping[Any, float]
    label: str
    # Where the table sweeps several families of one setting (CENSOR's T under each fallback):
    # each defense's family, named by the settings that tell the families apart.
    series: Mapping[Any, str] | None = None


@dataclass(frozen=True)
class Tradeoff:
    """The figure of a utility-privacy table (Refiner's Figs. 6, 9, 10): ``x`` (PMM) against each
    other metric; ``lines`` maps each defense of the table to its line's label (a sweep point's
    base defense) and its place along the line."""

    x: str
    lines: Mapping[str, tuple[str, int]]


def write_csv(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``df`` atomically with fixed float precision, empty NaN, ``\\n`` line ends."""
    with atomic_path(path) as tmp:
        df.to_csv(
            tmp,
            index=False,
            float_format=FLOAT_FORMAT,
            na_rep="",
            lineterminator="\n",
            encoding="utf-8",
        )


def _scales(df: pd.DataFrame, setting: Mapping[str, Any]) -> set[str]:
    """Scales of the runs; a ``setting['scale']`` that contradicts the files is an error."""
    scales = {str(s) for s in df["scale"].dropna()}
    claimed = setting.get("scale")
    if claimed is not None and scales and scales != {str(claimed)}:
        raise TableError(
            f"setting says scale={claimed!r} but the metrics files say {sorted(scales)}."
        )
    return scales


def _with_shared_runs(
    df: pd.DataFrame, shared: Mapping[str, tuple[str, str]], defenses: Sequence[str]
) -> pd.DataFrame:
    """The runs with a copy of the shared ones under each defense that reads them, with its
    label (``source`` still names the file); a run read only through such a defense is not a
    row of its own."""
    if not shared:
        return df
    copies = [
        df[df["defense"] == run].assign(defense=defense, defense_label=label)
        for defense, (run, label) in shared.items()
    ]
    only_shared = {run for run, _ in shared.values()} - set(defenses)
    df = pd.concat([df[~df["defense"].isin(only_shared)], *copies], ignore_index=True)
    return df.sort_values(list(JOB_KEYS), kind="stable", ignore_index=True)


def _with_shared_attacks(
    df: pd.DataFrame, shared: Mapping[str, Mapping[str, tuple[str, str]]]
) -> pd.DataFrame:
    """The runs with a copy of each plain attack's runs under each adaptive attack that has
    nothing to adapt to against that defense (``shared``: by defense, the attack shown and the
    attack run with the shown one's label; :func:`gradinv.adaptive.shared_attacks`)."""
    copies = [
        df[(df["defense"] == defense) & (df["attack"] == run)].assign(
            attack=attack, attack_label=label
        )
        for defense, attacks in shared.items()
        for attack, (run, label) in attacks.items()
    ]
    if not copies:
        return df
    df = pd.concat([df, *copies], ignore_index=True)
    return df.sort_values(list(JOB_KEYS), kind="stable", ignore_index=True)


def seed_values(
    training: Mapping[str, Mapping[tuple[str, str, str], tuple[Mapping[int, float], str]]],
    shared: Mapping[str, tuple[str, str]],
    defenses: Sequence[str],
    datasets: Sequence[str],
) -> pd.DataFrame:
    """One line per (dataset, model, defense of the table, seed): the training metrics
    (accuracy, PMM) of its FL run at that seed, a shared sweep point's from its base. What the
    claims on a table's accuracy pair seed by seed; header only for a table that shows none."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for metric, values in training.items():
        for (dataset, model, run), (seeds, _) in values.items():
            shown = [d for d in defenses if shared.get(d, (d,))[0] == run]
            for defense in shown if dataset in datasets else []:
                for seed, value in seeds.items():
                    key = (dataset, model, defense, seed)
                    rows.setdefault(key, dict(zip(SEED_COLUMNS, key, strict=True)))[metric] = value
    columns = [*SEED_COLUMNS, *training]
    return pd.DataFrame.from_records(list(rows.values()), columns=columns).sort_values(
        list(SEED_COLUMNS), kind="stable", ignore_index=True
    )


def victim_values(df: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One line per victim's run of the table (a shared run under each name that shows it):
    its job keys, status, and each image metric beside the floor's value on the same victim
    (``floor_<m>``). What the claims pair victim by victim (:mod:`gradinv.claims`)."""
    scored = [m for m in metrics if floor_column(m) in df.columns]
    columns = [*VICTIM_COLUMNS, *(c for m in scored for c in (m, floor_column(m)))]
    return df.reindex(columns=columns).reset_index(drop=True)


def _floor_checks(
    victims: pd.DataFrame,
    undefended_files: Sequence[str | os.PathLike[str]],
    metrics: Sequence[str],
    training: Mapping[str, Any],
) -> pd.DataFrame:
    """Whether each undefended attack beats the floor: the table's own undefended cells, and
    other tables' for the attacks it shows only under a defense (``from``: which)."""
    own = undefended_checks(victims, list(metrics)).assign(source="this table")
    if not undefended_files:
        return own
    elsewhere = collect(undefended_files, metrics=[m for m in metrics if m not in training])
    other = undefended_checks(victim_values(elsewhere, metrics), list(metrics))
    return pd.concat([own, other.assign(source="another table")], ignore_index=True)


def _provenance(df: pd.DataFrame) -> dict[str, str]:
    """What the files themselves say produced them, appended to the caller's setting."""
    out = {"runs scored": str(df["source"].nunique())}  # a shared run's rows: one run
    for key in ("git_commit", "config_hash", "data_sha256"):
        if key in df.columns:
            values = sorted({str(v) for v in df[key].dropna()})
            if values:
                out[key] = ", ".join(values)
    return out


def headline(long: pd.DataFrame, comparison: pd.DataFrame) -> dict[str, float | int | None]:
    """A table's headline numbers, the same keys for every table (``dvc metrics show`` lists
    one line per table): its victims and failures; the strongest attack's PSNR without a defense
    and under the defense that holds it lowest (the mean over victims of the attack whose mean
    is highest, per defense); how many of the paper's numbers it compares with ours and how many
    of them lie in our 95% interval. ``None`` where the table has no such value."""

    def number(value: Any) -> float | None:
        return float(value) if value is not None and math.isfinite(value) else None

    psnr = long[(long["metric"] == "psnr") & long["mean"].notna()]
    strongest = psnr.groupby("defense", sort=False)["mean"].max()  # per defense, over attacks
    defended = strongest.drop("none", errors="ignore")
    inside = comparison.get("paper_in_interval", pd.Series(dtype=object))
    return {
        "victims": int(long["n"].max()) if len(long) else 0,
        "failed_runs": int(long.groupby(["defense", "attack"])["failed"].max().sum()),
        "strongest_attack_psnr_no_defense": number(strongest.get("none")),
        "strongest_attack_psnr_best_defense": number(defended.min()) if len(defended) else None,
        "paper_numbers_compared": len(comparison),
        "paper_numbers_in_our_interval": int(sum(str(v) == "True" for v in inside)),
    }


def render_table(
    name: str,
    metric_files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    attacks: Sequence[str],
    defenses: Sequence[str],
    datasets: Sequence[str],
    setting: Mapping[str, Any],
    scaled_down_note: str,
    reference_csv: str | os.PathLike[str] | None,
    no_reference: str = "",
    rows: Sequence[str] = ("dataset", "defense"),
    metrics: Sequence[str] = DEFAULT_METRICS,
    title: str | None = None,
    reproduces: str = "the published table",
    sweep: Sweep | None = None,
    tradeoff: Tradeoff | None = None,
    training: Mapping[str, Mapping[tuple[str, str, str], tuple[float | None, str]]] | None = None,
    models: Sequence[str] | None = None,
    shared: Mapping[str, tuple[str, str]] | None = None,
    shared_attacks: Mapping[str, Mapping[str, tuple[str, str]]] | None = None,
    undefended_files: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, Path]:
    """Write ``<name>.csv``, ``<name>.md``, ``<name>_vs_paper.csv``, ``<name>_cells.csv`` (the
    long table: one line per cell, what ``workflow/claims.yaml`` is checked against) and
    ``figures/<name>.png``.

    ``attacks``, ``defenses`` and ``datasets`` are the run keys (``ig``, ``noise``, ...) in the
    paper's order; runs outside them are not part of this table. ``setting`` is listed verbatim in
    the Markdown, followed by the provenance recorded in the files (commits, config hashes);
    ``no_reference`` says there why a table without ``reference_csv`` has no published numbers.
    A run with scale "embedded" needs ``scaled_down_note``: a scaled-down table that does not say
    what was scaled down and why would be read as a failed reproduction. With ``sweep`` the
    figure is a line over the swept value (a round, CENSOR's T) instead of bars; with
    ``tradeoff`` it plots utility against privacy, a line per defense's sweep. ``training``
    gives the metrics of scope ``training`` (accuracy, PMM) by (dataset, model, defense) as (the
    values of its seeds, failure reason or ""), from the defenses' FL training runs rather than
    the metrics files.
    ``shared`` names the defenses shown from another's runs, with that defense and their label
    (a sweep point at its base's value: :func:`gradinv.sweeps.shared_runs`); ``shared_attacks``
    by defense run, the attacks shown from another attack's runs, with that attack and their
    label (an adaptive attack with nothing to adapt to: :func:`gradinv.adaptive.shared_attacks`).
    ``undefended_files``: other tables' undefended runs of its attacks, for a table without an
    undefended row: its Markdown says from them whether each attack beats the floor.
    """
    out_dir = Path(out_dir)
    training, shared = training or {}, shared or {}
    df = collect(metric_files, metrics=[m for m in metrics if m not in training])
    df = _with_shared_attacks(df, shared_attacks or {})
    df = _with_shared_runs(df, shared, defenses)
    # the defense whose FL training run a row's accuracy and PMM come from: its own, or its base's
    trained = df["defense"].map(lambda d: shared[d][0] if d in shared else d)
    for metric, values in training.items():
        runs = [values[k] for k in zip(df["dataset"], df["model"], trained, strict=True)]
        df[metric] = [sum(v.values()) / len(v) if v else math.nan for v, _ in runs]
        df[f"{metric}_seeds"] = [list(v.values()) for v, _ in runs]  # each seed that finished
        df[f"{metric}_failure"] = [failure for _, failure in runs]
        df[unavailable_column(metric)] = False
    scales = _scales(df, setting)
    scaled_down = "embedded" in scales
    if scaled_down and not scaled_down_note.strip():
        raise TableError(
            f"{name}: the runs are scaled down (scale 'embedded') but no "
            "scaled_down_note says what was scaled down and why."
        )
    long = long_table(
        df,
        rows=rows,
        attacks=attacks,
        defenses=defenses,
        metrics=metrics,
        datasets=datasets,
        models=models,
    )
    comparison = vs_paper(long, reference_csv) if reference_csv is not None else empty_comparison()
    paths = {
        "csv": out_dir / f"{name}.csv",
        "markdown": out_dir / f"{name}.md",
        "vs_paper": out_dir / f"{name}_vs_paper.csv",
        "cells": out_dir / f"{name}_cells.csv",
        "victims": out_dir / f"{name}_victims.csv",
        "training": out_dir / f"{name}_training.csv",
        "figure": out_dir / "figures" / f"{name}.png",
        "html": out_dir / f"{name}.html",  # the report's page: table, figure, paper beside ours
        "headline": out_dir / f"{name}_headline.json",  # what `dvc metrics show` lists
    }
    in_table = (
        df["attack"].isin(attacks) & df["defense"].isin(defenses) & df["dataset"].isin(datasets)
    )
    victims = victim_values(df[in_table], metrics)
    write_csv(widen(long, rows), paths["csv"])
    write_csv(comparison, paths["vs_paper"])
    write_csv(long, paths["cells"])
    write_csv(victims, paths["victims"])
    write_csv(seed_values(training, shared, defenses, datasets), paths["training"])
    scale = "embedded" if scaled_down else ", ".join(sorted(scales)) or "not recorded"
    caption = figure_caption(title or name, scale, paths["markdown"].name)
    if tradeoff is not None:
        facets = [c for c in rows if c != "defense"]
        tradeoff_figure(
            long,
            paths["figure"],
            x_metric=tradeoff.x,
            lines=tradeoff.lines,
            facets=facets,
            caption=caption,
        )
    elif sweep is None:
        table_figure(long, paths["figure"], rows=rows, caption=caption)
    else:
        sweep_figure(
            long,
            paths["figure"],
            x=sweep.values,
            x_column=sweep.column,
            x_label=sweep.label,
            caption=caption,
            series=sweep.series,
        )
    failed_runs = df[in_table & (df["status"] == "failed")]
    left_out = int((~in_table).sum())
    full_setting = {**setting, **_provenance(df[in_table])}
    if left_out:
        full_setting["runs outside this table (not shown)"] = str(left_out)
    text = render_markdown(
        long,
        title=title or f"{name}: defenses against gradient inversion attacks",
        rows=rows,
        setting=full_setting,
        scaled_down=scaled_down,
        reproduces=reproduces,
        scaled_down_note=scaled_down_note,
        comparison=comparison,
        reference_name=None if reference_csv is None else Path(reference_csv).name,
        no_reference=no_reference,
        failed_runs=failed_runs,
        csv_name=paths["csv"].name,
        vs_paper_name=paths["vs_paper"].name,
        figure_name=f"figures/{paths['figure'].name}",
        cells_name=paths["cells"].name,
        floor=_floor_checks(victims, undefended_files, metrics, training),
    )
    with atomic_path(paths["markdown"]) as tmp:
        tmp.write_text(text, encoding="utf-8")  # arrows and ±: never the locale's encoding
    write_text(paths["headline"], json.dumps(headline(long, comparison), indent=1) + "\n")
    write_table_page(
        paths["html"],
        title=title or name,
        markdown_text=text,
        figure=paths["figure"],
        figure_caption=caption,
        comparison=comparison,
        reference_name=None if reference_csv is None else Path(reference_csv).name,
    )
    return paths
