"""Put our cells next to the published numbers (``workflow/reference/*.csv``).

A comparison is only meaningful where we ran the paper's own dataset, so a cell is matched only
when its ``paper_dataset`` (null for stand-in datasets) equals the reference's dataset and its
defense/attack labels equal the paper's names ("No Defense", "Noise", "Clipping", "Sparsi",
"Soteria", "Censor"; "IG", "GI", "GGL", "GIAS", "GIFD"). Unmatched cells are simply not
compared; an embedded run on stand-in data yields a header-only file, which the Markdown states.
"""

from __future__ import annotations

import os

import pandas as pd

from gradinv.tables.aggregate import TableError, metric_spec

REFERENCE_COLUMNS: tuple[str, ...] = ("dataset", "defense", "attack", "metric", "value")
COMPARISON_COLUMNS: tuple[str, ...] = (
    "dataset",
    "defense",
    "attack",
    "metric",
    "ours_mean",
    "ours_std",
    "ours_ci_low",
    "ours_ci_high",
    "ours_n",
    "ours_failed",
    "paper",
    "difference",
    "paper_in_interval",
    "scale",
)


def empty_comparison(extra: list[str] | None = None) -> pd.DataFrame:
    """The header-only comparison, for runs without any of the paper's datasets."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in _columns(extra or [])})


def read_reference(reference_csv: str | os.PathLike[str]) -> pd.DataFrame:
    """Published numbers in long format; a wrong layout or a duplicated cell is an error."""
    ref = pd.read_csv(reference_csv)
    missing = [c for c in REFERENCE_COLUMNS if c not in ref.columns]
    if missing:
        raise TableError(
            f"{reference_csv}: missing column(s) {', '.join(missing)}; a reference for cell "
            f"comparison needs {', '.join(REFERENCE_COLUMNS)}."
        )
    keys = reference_keys(ref)
    dup = ref.duplicated(keys, keep=False)
    if dup.any():
        raise TableError(f"{reference_csv}: cells listed twice:\n{ref[dup].to_string()}")
    return ref


def reference_keys(ref: pd.DataFrame) -> list[str]:
    """The columns that identify a published cell: the standard four plus any extra setting
    column (``round`` in CENSOR's Table V); ``value`` and a free-text ``source`` are not keys."""
    return [c for c in ref.columns if c not in ("value", "source")]


def vs_paper(df_table_long: pd.DataFrame, reference_csv: str | os.PathLike[str]) -> pd.DataFrame:
    """Our mean/std/n beside the paper's value for every matching cell, in the table's order.

    ``difference`` is ours minus the paper's; ``paper_in_interval`` whether the published value
    lies in our cell's 95% interval over victims (empty where there is none: one victim).
    ``scale`` says whether our cell came from the scaled-down ("embedded") or the paper-scale
    run, because only the latter is meant to agree.
    """
    ref = read_reference(reference_csv)
    long = df_table_long[df_table_long["paper_dataset"].notna()]
    extra = [k for k in reference_keys(ref) if k not in REFERENCE_COLUMNS]
    if long.empty:
        return empty_comparison(extra)
    ours = pd.DataFrame(
        {
            "dataset": long["paper_dataset"].astype(str),
            "defense": long["defense_label"].astype(str),
            "attack": long["attack_label"].astype(str),
            "metric": [metric_spec(m).label for m in long["metric"]],
            "ours_mean": long["mean"].astype(float),
            "ours_std": long["std"].astype(float),
            "ours_ci_low": long["ci_low"].astype(float),
            "ours_ci_high": long["ci_high"].astype(float),
            "ours_n": long["n"].astype("int64"),
            "ours_failed": long["failed"].astype("int64"),
            "scale": long["scale"],
        }
    )
    keys = reference_keys(ref)
    extra = [k for k in keys if k not in REFERENCE_COLUMNS]
    missing = [k for k in extra if k not in long.columns]
    if missing:
        raise TableError(
            f"{reference_csv}: key column(s) {', '.join(missing)} are not columns of this table."
        )
    for key in extra:
        ours.insert(len(REFERENCE_COLUMNS) - 1, key, long[key].astype(str).to_numpy())
    ref = ref.drop(columns=[c for c in ref.columns if c == "source"])
    ref = ref.assign(**{c: ref[c].astype(str) for c in keys})
    merged = ours.merge(ref.rename(columns={"value": "paper"}), how="inner", on=keys, sort=False)
    if merged.empty:
        return empty_comparison(extra)
    merged["paper"] = merged["paper"].astype(float)
    merged["difference"] = merged["ours_mean"] - merged["paper"]
    # whether the published value lies in our 95% interval over victims; empty without one
    inside = (merged["ours_ci_low"] <= merged["paper"]) & (
        merged["paper"] <= merged["ours_ci_high"]
    )
    known = merged["ours_ci_low"].notna() & merged["ours_ci_high"].notna()
    merged["paper_in_interval"] = inside.where(known, None).astype(object)
    return merged[_columns(extra)].reset_index(drop=True)


def _columns(extra: list[str]) -> list[str]:
    base = list(COMPARISON_COLUMNS)
    return [*base[:3], *extra, *base[3:]]
