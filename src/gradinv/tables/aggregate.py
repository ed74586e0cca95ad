"""Aggregate per-victim metrics into the cells of a paper table (CENSOR, NDSS 2025, Table I).

A cell is one (row, attack, metric): the mean over the victims whose run finished (``status``
"ok"), the standard deviation of those values, how many went in (``n``) and how many failed.

Why these rules (failures are loud and recorded):
* A failed victim is never averaged in and never dropped: it is counted in ``failed`` and its
  reason is kept in the cell's ``note``. An "ok" run whose metric is NaN/inf is counted as failed
  for that metric, because averaging it would poison the mean and skipping it would hide it;
  except a metric's value for an exact reconstruction (``MetricSpec.exact``: PSNR's +inf, when
  the MSE is 0), which is the attack's best result, not a failure: it goes into the mean (which
  is then +inf, as the mean PSNR is), the std is left empty, and the note counts them.
* A ``null`` metric means "could not be computed" (e.g. LPIPS without its weights): the cell stays
  empty and the note carries the reason from ``<metric>_status`` when the file has one.
* ``unavailable`` (long table only) counts the ok runs with a null value, so renderers need not
  parse the note.
* ``std`` uses ddof=1 (the sample standard deviation): the victims are a sample of the test set,
  as in the paper (every 1000th validation image). With n = 1 it is undefined and left empty
  rather than reported as a misleading 0.
* ``ci_low``/``ci_high``: the 95% interval of the mean over the victims, a percentile bootstrap
  (:func:`gradinv.stats.bootstrap_mean`, 10,000 resamples, seeded by the cell's key, so a
  rerender gives the same bytes); empty for a single victim.
* ``exact`` counts the victims reconstructed exactly (already in ``n``), ``not_scored`` the runs
  that had nothing to score (a DCS² batch without a sensitive sample): in neither ``n`` nor
  ``failed``, but counted, so that a cell of such runs only is not mistaken for a missing one.
* ``floor_gain``: the median over the cell's victims of how much closer the reconstruction is
  than the floor (the public split's mean image scored against the same victim; positive: the
  attack did better, :func:`floor_gains`), over ``floor_n`` victims with both values. A cell at or
  below 0 recovered nothing, on the median victim, that the mean image does not give.
"""

from __future__ import annotations

import difflib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gradinv.stats import bootstrap_mean, mean_over_seeds
from gradinv.tables.files import DEFAULT_METRICS, floor_column, unavailable_column


@dataclass(frozen=True)
class MetricSpec:
    """How a metric is named and read in the paper: its label, arrow and printed decimals.

    ``scope``: ``victim``, one value per attacked victim (the cell is their mean), or
    ``training``, one value per defense and seed from its FL training runs (the utility study's
    accuracy and PMM), the same in every cell of the defense's row: the cell is their mean over
    the seeds, with n the seeds.
    """

    label: str
    arrow: str  # CENSOR's direction: "↑" higher is better for the defender, "↓" lower is better
    decimals: int
    scope: str = "victim"
    # Its value for an exact reconstruction where that is not finite: the image metric's
    # ``best`` (gradinv.metrics; not imported here, which would load torch for every table).
    exact: float | None = None
    unit: str = ""  # printed on a figure's axis: "dB"


METRICS: dict[str, MetricSpec] = {
    "mse": MetricSpec("MSE", "↑", 4),
    "lpips": MetricSpec("LPIPS", "↑", 4),
    "psnr": MetricSpec("PSNR", "↓", 3, exact=math.inf, unit="dB"),
    "ssim": MetricSpec("SSIM", "↓", 4),
    "noise_ratio": MetricSpec("NoiseRatio", "↑", 3),
    "label_accuracy": MetricSpec("LabelAcc", "↓", 3),
    # What the server received: cosine of the shared update with the client's true gradient,
    # and (CENSOR) whether no candidate beat the undefended loss; the mean is the rate.
    "update_cosine": MetricSpec("UpdateCos", "↓", 4),
    "fallback_rate": MetricSpec("Fallback", "↓", 3),
    # CENSOR under Algorithm 1: whether the victim's update was its raw gradient G0; the mean
    # is the share of victims whose update was not protected at all.
    "raw_gradient": MetricSpec("RawG0", "↓", 3),
    # The CVB paper's attack success rate: the mean over victims of the share of images
    # reconstructed at SSIM >= metrics.success_ssim.
    "attack_success": MetricSpec("ASR", "↓", 3),
    # Refiner's Table 4: seconds one client spends on its defended update in a round.
    "client_seconds": MetricSpec("Time(s)", "↓", 4),
    # What the defense costs: the test accuracy (%) of FL training under it, and Refiner's PMM
    # (that accuracy over the accuracy without a defense), from the utility study's runs.
    "accuracy": MetricSpec("Accuracy", "↑", 2, scope="training"),
    "pmm": MetricSpec("PMM", "↑", 3, scope="training"),
}
STATS: tuple[str, ...] = ("mean", "std", "ci_low", "ci_high", "n", "failed", "note")
#: Per-cell counts and the comparison with the floor, in the long table only (module docstring).
CELL_EXTRAS: tuple[str, ...] = ("exact", "not_scored", "unavailable", "floor_gain", "floor_n")
#: The extras of a cell without victims (no runs, or a training metric).
NO_EXTRAS: dict[str, Any] = {
    "exact": 0,
    "not_scored": 0,
    "unavailable": 0,
    "floor_gain": math.nan,
    "floor_n": 0,
}
#: The image metrics the floor (the public split's mean image) is scored on.
FLOORED: tuple[str, ...] = ("mse", "psnr", "ssim", "lpips", "noise_ratio")
#: Columns that must not vary inside one cell unless they are rows of the table.
SETTING_KEYS: tuple[str, ...] = ("dataset", "model", "defense", "round", "batch_size")
#: Per-cell context carried into the long table (for comparisons and captions).
CONTEXT: tuple[str, ...] = (
    "dataset",
    "dataset_label",
    "paper_dataset",
    "defense",
    "defense_label",
    "model",
    "round",
    "batch_size",
    "scale",
)


class TableError(ValueError):
    """The runs cannot form the requested table (mixed settings, unknown metric, ...)."""


def metric_spec(metric: str) -> MetricSpec:
    """The spec of ``metric``; an unknown name is an error that suggests the close matches."""
    if metric not in METRICS:
        close = difflib.get_close_matches(metric, METRICS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise TableError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}.{hint}")
    return METRICS[metric]


def training_scope(metric: str) -> bool:
    """Whether ``metric`` comes from the defenses' training runs (accuracy, PMM), not attacks."""
    return metric in METRICS and METRICS[metric].scope == "training"


def metric_header(metric: str) -> str:
    """``MSE↑``: the paper's column name with its arrow."""
    spec = metric_spec(metric)
    return f"{spec.label}{spec.arrow}"


def metric_axis_label(metric: str) -> str:
    """A figure's axis for ``metric``: its name, unit and the direction better for the
    defender, ``PSNR (dB) ↓\nlower: better for the defender``."""
    spec = metric_spec(metric)
    unit = f" ({spec.unit})" if spec.unit else ""
    better = "higher" if spec.arrow == "↑" else "lower"
    return f"{spec.label}{unit} {spec.arrow}\n{better}: better for the defender"


def _unique(values: pd.Series, what: str) -> Any:
    found = list(dict.fromkeys(None if pd.isna(v) else v for v in values))
    if len(found) > 1:
        raise TableError(f"{what} is not unique: {found}.")
    return found[0] if found else None


def _row_values(df: pd.DataFrame, column: str, given: Sequence[Any] | None) -> list[Any]:
    if given is not None:
        return list(given)
    return sorted(df[column].dropna().unique().tolist())


def _row_label(df: pd.DataFrame, column: str, key: Any) -> str:
    if f"{column}_label" in df.columns:
        labels = df.loc[df[column] == key, f"{column}_label"]
        label = _unique(labels, f"{column}_label of {column}={key!r}")
        if label is not None:
            return str(label)
    return str(key)


def _joined(values: pd.Series) -> str:
    return "; ".join(sorted({str(v) for v in values.dropna()}))


def floor_gains(victims: pd.DataFrame, metric: str) -> np.ndarray:
    """Each victim's gain over the floor, oriented so that positive means the attacker did
    better: value − floor for PSNR and SSIM (higher is closer), floor − value for MSE, LPIPS and
    the noise ratio (lower is closer); the ok runs with both values only."""
    column = floor_column(metric)
    if metric not in FLOORED or column not in victims.columns:
        return np.array([])
    ok = victims[(victims["status"] == "ok") & victims[metric].notna() & victims[column].notna()]
    value, floor = ok[metric].to_numpy(float), ok[column].to_numpy(float)
    gain = value - floor if metric_spec(metric).arrow == "↓" else floor - value
    return gain[~np.isnan(gain)]


def _cell(group: pd.DataFrame | None, metric: str, key: tuple[Any, ...] = ()) -> dict[str, Any]:
    """Statistics of one cell under the rules in the module docstring; ``key`` names the cell
    and seeds its bootstrap."""
    empty = {
        "mean": math.nan,
        "std": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "n": 0,
        "failed": 0,
        "note": "no runs",
        **NO_EXTRAS,
    }
    if group is None or group.empty:
        return empty
    if metric_spec(metric).scope == "training":
        return _training_cell(group, metric)
    spec = metric_spec(metric)
    label = spec.label
    ok = group[group["status"] == "ok"]
    failed = group[group["status"] == "failed"]
    null = ok[unavailable_column(metric)].astype(bool).to_numpy()
    values = ok.loc[~null, metric].to_numpy(dtype=np.float64)
    exact = values == spec.exact if spec.exact is not None else np.zeros(len(values), bool)
    kept = values[np.isfinite(values) | exact]
    nonfinite = len(values) - len(kept)
    notes = []
    if null.any():
        status_col = f"{metric}_status"
        reason = _joined(ok.loc[null, status_col]) if status_col in ok.columns else ""
        reason = reason or "unavailable (null in the metrics file)"
        scope = "" if null.all() else f"{int(null.sum())} of {len(ok)} ok runs: "
        notes.append(f"{scope}{label} {reason}")
    if exact.any():
        notes.append(f"{int(exact.sum())} exact reconstruction(s): {label} {spec.exact} (MSE 0)")
    if nonfinite:
        notes.append(f"{nonfinite} ok run(s) gave a non-finite {label}")
    if len(failed):
        notes.append(f"{len(failed)} failed: {_joined(failed['failure']) or 'no reason given'}")
    unscored = group[group["status"] == "not_scored"]
    if len(unscored):
        notes.append(f"{len(unscored)} not scored: {_joined(unscored['failure'])}")
    n = len(kept)
    low, high = bootstrap_mean(kept, *key, metric)
    gains = floor_gains(group, metric)
    return {
        "mean": float(np.mean(kept)) if n else math.nan,
        "std": float(np.std(kept, ddof=1)) if n > 1 and not exact.any() else math.nan,
        "ci_low": low,
        "ci_high": high,
        "n": n,
        "failed": len(failed) + nonfinite,
        "note": " | ".join(notes),
        "exact": int(exact.sum()),
        "not_scored": len(unscored),
        "unavailable": int(null.sum()),
        "floor_gain": float(np.median(gains)) if len(gains) else math.nan,
        "floor_n": len(gains),
    }


def _raw_gradients(group: pd.DataFrame | None) -> dict[str, Any]:
    """How many of a cell's victims shared their raw gradient (CENSOR under Algorithm 1: no
    candidate beat the undefended loss) and of how many the capture recorded it: ``raw_shared``
    is NA where none did (a defense that never shares it)."""
    column = "raw_gradient_shared"
    if group is None or column not in group.columns:
        return {"raw_shared": pd.NA, "raw_recorded": 0}
    known = group[column].dropna()
    if known.empty:
        return {"raw_shared": pd.NA, "raw_recorded": 0}
    return {"raw_shared": int(known.astype(bool).sum()), "raw_recorded": len(known)}


def _training_cell(group: pd.DataFrame, metric: str) -> dict[str, Any]:
    """A metric of the defense's FL training runs (accuracy, PMM): one value per seed that
    finished (``<metric>_seeds``), the same for the whole cell whatever its attacks did; the
    cell is their mean with a 95% t-interval over the seeds, n the seeds. A failed run is counted
    as failed, with its reason (``<metric>_failure``)."""
    if f"{metric}_seeds" in group:
        values = [float(v) for v in group[f"{metric}_seeds"].iloc[0]]
    else:
        values = [float(group[metric].iloc[0])]
    values = [v for v in values if not math.isnan(v)]
    failure = str(group[f"{metric}_failure"].iloc[0] or "")
    source = "from the defense's FL training runs (utility study), over their seeds"
    over = mean_over_seeds(values)
    return {
        "mean": over.estimate if values else math.nan,
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else math.nan,
        "ci_low": over.low,
        "ci_high": over.high,
        "n": len(values),
        "failed": _failed_runs(failure, bool(values)),
        "note": f"{source}: {failure}" if failure else source,
        **NO_EXTRAS,
    }


def _failed_runs(failure: str, any_value: bool) -> int:
    """The training runs a cell's failure note names (one "training ..." part each); a note
    without any and no value at all is one failure."""
    named = sum(1 for part in failure.split("; ") if part.startswith("training "))
    return named or int(bool(failure) and not any_value)


def _check_group(group: pd.DataFrame, rows: Sequence[str], where: str) -> None:
    for key in SETTING_KEYS:
        if key not in rows and key in group.columns and group[key].nunique(dropna=False) > 1:
            raise TableError(
                f"cell {where} mixes runs with {key} = {sorted(map(str, group[key].unique()))} "
                f"(e.g. {', '.join(group['source'].head(2))}); add {key!r} to rows or pass only "
                "the files of one setting."
            )
    dup = group["victim"].duplicated(keep=False)
    if dup.any():
        raise TableError(
            f"cell {where} has victim(s) twice: {', '.join(group.loc[dup, 'source'])}."
        )


def long_table(
    df: pd.DataFrame,
    *,
    rows: Sequence[str] = ("dataset", "defense"),
    attacks: Sequence[str],
    defenses: Sequence[str],
    metrics: Sequence[str] = DEFAULT_METRICS,
    datasets: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One line per (row, attack, metric) cell, in the table's order; the source of every output.

    Rows are the product of the ordered row values (``datasets``, ``models`` and ``defenses`` give
    the order of those columns; other row columns are sorted), so a combination without any run
    shows up as a ``no runs`` cell instead of vanishing. Runs outside the listed attacks, defenses
    and datasets are not part of this table and are left out.
    """
    for metric in metrics:
        metric_spec(metric)
    missing = [c for c in (*rows, "attack", "status", *metrics) if c not in df.columns]
    if missing:
        raise TableError(f"the runs lack column(s) {', '.join(missing)} needed for this table.")
    keep = df["attack"].isin(attacks) & df["defense"].isin(defenses)
    if datasets is not None:
        keep &= df["dataset"].isin(datasets)
    sub = df[keep]
    given = {"dataset": datasets, "defense": defenses, "model": models}
    row_values = [_row_values(sub, c, given.get(c)) for c in rows]
    groups = {key: g for key, g in sub.groupby([*rows, "attack"], sort=False, dropna=False)}
    attack_labels = {a: _row_label(sub, "attack", a) for a in attacks}
    if len(set(attack_labels.values())) < len(attack_labels):
        raise TableError(f"two attacks share a label: {attack_labels}.")
    records = []
    for row_key in itertools.product(*row_values):
        base: dict[str, Any] = {}
        for column, key in zip(rows, row_key, strict=True):
            base[column] = key
            base[f"{column}_label"] = _row_label(sub, column, key)
        for attack in attacks:
            group = groups.get((*row_key, attack))
            where = ", ".join(
                f"{k}={v}" for k, v in [*zip(rows, row_key, strict=True), ("attack", attack)]
            )
            context = {c: None for c in CONTEXT}
            if group is not None:
                _check_group(group, rows, where)
                context = {
                    c: _unique(group[c], f"{c} in cell {where}") if c in group else None
                    for c in CONTEXT
                }
            if "dataset" in rows:
                context["paper_dataset"] = (
                    _unique(
                        sub.loc[sub["dataset"] == base["dataset"], "paper_dataset"],
                        f"paper_dataset of dataset={base['dataset']!r}",
                    )
                    if "paper_dataset" in sub
                    else None
                )
            raw = _raw_gradients(group)
            for metric in metrics:
                records.append(
                    {
                        **context,
                        **base,
                        "attack": attack,
                        "attack_label": attack_labels[attack],
                        "metric": metric,
                        **_cell(group, metric, (*row_key, attack)),
                        **raw,
                    }
                )
    columns = list(
        dict.fromkeys(
            [
                *rows,
                *(f"{c}_label" for c in rows),
                "attack",
                "attack_label",
                "metric",
                *STATS,
                *CELL_EXTRAS,
                "raw_shared",
                "raw_recorded",
                *CONTEXT,
            ]
        )
    )
    return pd.DataFrame.from_records(records, columns=columns)


def widen(long: pd.DataFrame, rows: Sequence[str] = ("dataset", "defense")) -> pd.DataFrame:
    """The paper's layout: one line per row, ``<attack> <metric><arrow> <stat>`` columns.

    Row columns show the human labels (``No Defense``, not ``none``); cell columns follow the
    attack and metric order of the long table, so the CSV header is stable across reruns.
    """
    line_keys = list(dict.fromkeys(tuple(r) for r in long[list(rows)].itertuples(index=False)))
    lines: dict[tuple[Any, ...], dict[str, Any]] = {k: {} for k in line_keys}
    # CENSOR's raw-gradient count, once per (line, attack), where any capture recorded it
    raw = "raw_recorded" in long.columns and bool((long["raw_recorded"] > 0).any())
    for rec in long.to_dict("records"):
        line = lines[tuple(rec[c] for c in rows)]
        for column in rows:
            line[column] = rec[f"{column}_label"]
        head = f"{rec['attack_label']} {metric_header(rec['metric'])}"
        for stat in STATS:
            line[f"{head} {stat}"] = rec[stat]
        if raw:
            line[f"{rec['attack_label']} raw gradient shared"] = raw_text(rec)
    wide = pd.DataFrame.from_records(list(lines.values()))
    for column in wide.columns:
        if column.endswith((" n", " failed")):
            wide[column] = wide[column].astype("int64")
    return wide


def raw_text(rec: dict[str, Any]) -> str:
    """``3 of 8``: the victims whose update was the raw gradient, of those recorded; empty for a
    defense that records none."""
    if not rec.get("raw_recorded"):
        return ""
    return f"{int(rec['raw_shared'])} of {int(rec['raw_recorded'])}"


def paper_table(
    df: pd.DataFrame,
    *,
    rows: Sequence[str] = ("dataset", "defense"),
    attacks: Sequence[str],
    defenses: Sequence[str],
    metrics: Sequence[str] = DEFAULT_METRICS,
    datasets: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The wide table of :func:`widen` straight from collected runs (see :func:`long_table`)."""
    long = long_table(
        df, rows=rows, attacks=attacks, defenses=defenses, metrics=metrics, datasets=datasets
    )
    return widen(long, rows)
