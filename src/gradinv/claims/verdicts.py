"""A claim's verdicts: on this run, paired comparisons with intervals (:mod:`gradinv.claims.
paired`); on the paper's published numbers, a comparison of its cell means (all a published
table gives), which checks how the claim is encoded.

The rules of the published check (groups without both values, metrics never computed,
``expect`` and ``only_where``) are described in ``gradinv.claims``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from gradinv.claims.paired import GROUP_VERDICTS, evaluate_paired
from gradinv.claims.spec import (
    Check,
    Claim,
    ClaimError,
    as_text,
    group_name,
    is_utility,
    key_text,
    matches,
)
from gradinv.tables.aggregate import METRICS, training_scope

VERDICTS = ("holds", "fails", "inconclusive", "undecidable", "not evaluated")
COLUMNS = (
    "id",
    "paper",
    "source",
    "claim",
    "verdict",
    *(f"{v}_groups" for v in GROUP_VERDICTS),
    "evidence",
    "reason",
    "to_decide",
    "combine",
    "table",
    "scale",
    "paper_verdict",
)


def evaluate(
    claims: Sequence[Claim],
    results: Mapping[str, pd.DataFrame],
    scale: str,
    published: Mapping[str, pd.DataFrame] | None = None,
    missing: Mapping[str, str] | None = None,
    undefended: pd.DataFrame | None = None,
    training: Mapping[str, pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """One line per claim. ``results`` maps a check's table to its per-victim values
    (``<table>_victims.csv``; the utility table: its runs), absent when this configuration does
    not build it; ``scale`` is the run's (embedded or paper), recorded on every line;
    ``published`` maps a table to the paper's numbers in the layout of ``<table>_cells.csv``
    (``reference_cells``); ``missing`` maps a table this configuration builds but whose file is
    absent to the reason; ``undefended``: every table's per-victim values, where the floor checks
    find the undefended attacks; ``training`` maps a table to its accuracy and PMM seed by seed
    (``<table>_training.csv``)."""
    rows = []
    for claim in claims:
        frame = results.get(claim.check.table)
        if claim.check.table in (missing or {}):
            row = _row(claim, "not evaluated", reason=missing[claim.check.table])
        elif frame is None:
            reason = f"{claim.check.table} is not built by this configuration"
            row = _row(claim, "not evaluated", reason=reason)
        else:
            seeds = (training or {}).get(claim.check.table)
            row = _row(claim, **evaluate_paired(claim, frame, undefended, seeds))
        paper = (published or {}).get(claim.check.table)
        if paper is not None:
            row["paper_verdict"] = _evaluate(claim, paper)["verdict"]
        rows.append(row)
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS)).assign(scale=scale)


def reference_cells(
    reference: pd.DataFrame,
    labels: Mapping[str, Mapping[str, str]],
    runs: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """A published table (``dataset, defense, attack, metric, value`` in the paper's names) in
    the layout of ``<table>_cells.csv``: run keys for defenses, attacks and metrics (through
    params.yaml's labels, among the table's own ``runs`` where given: ``{"defenses": [...],
    "attacks": [...]}``, since two tables' defenses may share a label), the paper's dataset
    names. Lines naming no run of ours are dropped."""
    keys = {
        column: {
            label: key for key, label in labels[kind].items() if runs is None or key in runs[kind]
        }
        for column, kind in (("defense", "defenses"), ("attack", "attacks"))
    }
    keys["metric"] = {spec.label: key for key, spec in METRICS.items()}
    out = reference.rename(columns={"value": "mean"}).drop(columns=["source"], errors="ignore")
    for column, mapping in keys.items():
        out[column] = out[column].map(mapping)
    return out.dropna(subset=list(keys))


def _row(claim: Claim, verdict: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": claim.id,
        "paper": claim.paper,
        "source": claim.source,
        "claim": claim.claim,
        "verdict": verdict,
        **{f"{v}_groups": fields.get(f"{v}_groups", 0) for v in GROUP_VERDICTS},
        "evidence": fields.get("evidence", ""),
        "reason": fields.get("reason", ""),
        "to_decide": fields.get("to_decide", ""),
        "combine": combination(claim.check),
        "table": claim.check.table,
        "scale": "",
        "paper_verdict": "",
    }


def combination(check: Check) -> str:
    """How the check's groups combine into the claim's verdict, in words (``claims.md``)."""
    unit = "seed" if is_utility(check.table) or _on_training(check) else "victim"
    groups = f"one group per {', '.join(check.over)}" if check.over else "one group"
    pairs = f"{check.compare} {check.left} against {check.right}, paired {unit} by {unit}"
    if check.only_where:
        named = "; ".join(f"{c} {', '.join(map(str, vs))}" for c, vs in check.only_where.items())
        rule = f"holds if it holds where {named} and fails in every other group"
    elif check.expect == "all":
        rule = "holds if every decidable group holds, fails if any fails"
    else:
        rule = (
            f"holds if at least {float(check.expect):.0%} of the decidable groups hold, fails "
            "once that is out of reach"
        )
    return f"{groups} ({pairs}); the claim {rule}"


def _on_training(check: Check) -> bool:
    return bool(check.metrics) and all(training_scope(m) for m in check.metrics)


def _tidy(check: Check, frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as (group columns..., compare column, metric, value)."""
    if is_utility(check.table):
        metrics = check.metrics or ("accuracy",)
        missing = [m for m in metrics if m not in frame.columns]
        if missing:
            raise ClaimError(f"utility.csv has no column(s) {missing}.")
        return frame.melt(
            id_vars=[c for c in frame.columns if c not in metrics],
            value_vars=list(metrics),
            var_name="metric",
            value_name="value",
        )
    sub = frame[frame["metric"].isin(check.metrics)] if check.metrics else frame
    if _on_training(check):
        # accuracy and PMM: one value per defense, which a published table repeats under each
        # attack (a claim on them names no attack: gradinv.claims.spec)
        sub = sub.drop(columns=["attack"], errors="ignore").drop_duplicates()
    return sub.rename(columns={"mean": "value"})


def _evaluate(claim: Claim, frame: pd.DataFrame) -> dict[str, Any]:
    check = claim.check
    keys = {check.compare, *check.over, *check.where, *check.only_where}
    tidy = _tidy(check, frame)
    absent = [c for c in sorted(keys) if c not in tidy.columns]
    if absent:
        raise ClaimError(f"{claim.id}: {check.table} has no column(s) {absent}.")
    tidy = as_text(_with_constant_context(tidy, check.over), keys)
    for column, values in check.where.items():
        tidy = tidy[tidy[column].isin([key_text(v) for v in values])]
    notes = []
    if check.metrics and not is_utility(check.table):
        tidy, notes = _without_metrics_never_computed(check, tidy)
    if tidy.empty:
        reason = "; ".join([*notes, "no cell matches the check's metrics and 'where'"])
        return _row(claim, "not evaluated", reason=reason)
    over = [*check.over, *(["metric"] if tidy["metric"].nunique() > 1 else [])]
    groups = list(tidy.groupby(over, sort=False)) if over else [((), tidy)]
    outcomes = []  # (group key, satisfied or None, text)
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        group_key = dict(zip(over, key, strict=True))
        outcomes.append((group_key, *_compare(check, group_name(group_key), group)))
    evaluated = [o for o in outcomes if o[1] is not None]
    satisfied = [o for o in evaluated if o[1]]
    fields = dict(
        satisfied=len(satisfied),
        evaluated=len(evaluated),
        groups=len(outcomes),
        evidence="; ".join(text for _, _, text in outcomes),
    )
    if not evaluated:
        reason = "; ".join([*notes, "no group has both values"])
        return _row(claim, "not evaluated", reason=reason, **fields)
    skipped = len(outcomes) - len(evaluated)
    if skipped:
        notes.append(f"{skipped} of {len(outcomes)} group(s) without both values")
    if check.only_where:
        wrong = [group_name(g) for g, ok, _ in evaluated if ok != matches(g, check.only_where)]
        if wrong:
            notes.append("unlike the claim in " + ", ".join(wrong))
        # a group without both values could go either way: it can only make the claim fail
        verdict = "fails" if wrong else "not evaluated" if skipped else "holds"
    else:
        need = math.ceil(
            (1.0 if check.expect == "all" else float(check.expect)) * len(outcomes) - 1e-9
        )
        if len(satisfied) >= need:
            verdict = "holds"
        elif len(satisfied) + skipped < need:
            verdict = "fails"
        else:
            verdict = "not evaluated"
    if verdict == "not evaluated":
        notes.append(
            f"undecided: the relation holds in {len(satisfied)} of {len(evaluated)} evaluated "
            "group(s), and the groups without both values decide the verdict"
        )
    return _row(claim, verdict, reason="; ".join(notes), **fields)


def _with_constant_context(tidy: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """A cell without runs has no context of its own (its model is empty where the table has one
    model): it takes the table's one value, so that it joins its group instead of making one."""
    out = tidy.copy()
    for column in columns:
        known = out[column].dropna().unique()
        if len(known) == 1:
            out[column] = out[column].fillna(known[0])
    return out


def _without_metrics_never_computed(
    check: Check, tidy: pd.DataFrame
) -> tuple[pd.DataFrame, list[str]]:
    """The selection less the metrics this run could not compute (unavailable in every cell:
    LPIPS without its weights), with a note for each: the claim is then checked on the other
    metrics. A metric that failed or gave no value for another reason stays, and its groups
    decide nothing."""
    notes = []
    for metric in check.metrics:
        cells = tidy[tidy["metric"] == metric]
        if cells.empty:
            notes.append(f"{metric} is not in {check.table}")
            continue
        unavailable = cells.get("unavailable", pd.Series(0, index=cells.index)).fillna(0)
        if cells["value"].isna().all() and (unavailable > 0).any():
            why = sorted({str(n) for n in cells.get("note", pd.Series(dtype=str)).dropna() if n})
            notes.append(
                f"{metric} is unavailable in this run" + (f" ({'; '.join(why)})" if why else "")
            )
            tidy = tidy[tidy["metric"] != metric]
    return tidy, notes


def _compare(check: Check, name: str, group: pd.DataFrame) -> tuple[bool | None, str]:
    """Whether the relation holds in one group, and the numbers, as text."""
    by_value = group.groupby(check.compare, sort=False)["value"]
    if (by_value.size() > 1).any():
        raise ClaimError(
            f"{name}: several cells per {check.compare}; add the column that tells them apart "
            "(round, ...) to the check's 'over', or select one with 'where'."
        )
    values = by_value.first()
    left = values.get(check.left)
    rights = (
        [(r, v) for r, v in values.items() if r != check.left]
        if check.right == "others"
        else [(check.right, values.get(check.right))]
    )
    absent = [n for n, v in [(check.left, left), *rights] if _missing(v)]
    if absent or not rights:
        return None, f"{name}: no value for {', '.join(map(str, absent or [check.right]))}"
    metric = str(group["metric"].iloc[0])
    results = [_holds(check, metric, float(left), float(v)) for _, v in rights]
    spread = _spreads(group, check.compare, metric)
    parts = ", ".join(f"{r} {_fmt(v)}{spread.get(r, '')}" for r, v in rights)
    mark = "yes" if all(results) else "no"
    left_text = f"{check.left} {_fmt(left)}{spread.get(check.left, '')}"
    return all(results), f"{name}: {left_text} vs {parts} ({mark})"


def _spreads(group: pd.DataFrame, compare: str, metric: str) -> dict[str, str]:
    """For the utility table's accuracy, each value's spread (the standard deviation of the
    evaluations it averages) as " ± x", so that a reader sees when a difference is within it."""
    if metric != "accuracy" or "accuracy_spread" not in group.columns:
        return {}
    spreads = group.groupby(compare, sort=False)["accuracy_spread"].first()
    return {str(k): f" ± {_fmt(v)}" for k, v in spreads.items() if not _missing(v)}


def _holds(check: Check, metric: str, left: float, right: float) -> bool:
    relation = check.relation
    if relation == "better":
        relation = "greater" if METRICS[metric].arrow == "↑" else "less"
    if relation == "less":
        return left < right - check.tolerance
    if relation == "greater":
        return left > right + check.tolerance
    if relation == "not_below":
        return left >= right - check.tolerance
    return left == right or abs(left - right) <= check.tolerance  # two exact (PSNR ∞): equal


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any) -> str:
    return f"{float(value):.4g}"
