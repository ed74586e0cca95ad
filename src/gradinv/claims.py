"""The papers' qualitative claims, checked against our result files.

``workflow/claims.yaml`` lists each claim with its source (paper, section) and a check: a
relation between two values of one column of a result, in every group of cells. For example
"CENSOR gives lower SSIM than no defense for every attack and dataset" compares the ``defense``
column's ``censor`` and ``none`` cells of Table I's SSIM, grouped by dataset and attack::

    check:
      table: table1          # results/table1_cells.csv (or "utility": results/utility.csv)
      metrics: [ssim]
      compare: defense       # the column whose two values are compared ...
      left: censor
      right: none            # ... or "others": every other value of the column, one at a time
      relation: less         # less | greater | better (each by more than `tolerance`, default
                             # 0) | within (|left - right| <= tolerance) | not_below (left
                             # >= right - tolerance: "costs at most 1 point of accuracy")
      over: [dataset, attack]

``better`` reads the direction from the metric's arrow (higher MSE is better for the defender,
lower SSIM is). What must hold across groups is ``expect``: ``all`` (the default), a fraction
(``0.8``: "in almost all cases"), or ``only_where`` (the relation holds in the groups matching
it and in no other: "Soteria beats CENSOR only against IG and GI").

Where the table has published numbers (``workflow/reference/``), the same check also runs on
them: ``paper_verdict`` says whether the paper's own table bears the claim out as encoded, which
tests the encoding (a claim the paper's numbers do not support is worded or checked wrongly).

A verdict is ``holds``, ``fails`` or ``not evaluated``, always with the numbers behind it and
the scale of the run: a claim that fails on the scaled-down run is a finding about that run,
reported as such. A group without both values (a cell with no runs) is never read as agreeing:
the verdict is ``holds`` or ``fails`` only when it would be the same whichever way those groups
went, and ``not evaluated`` otherwise, as it is when the table is not built, its result file is
missing, or no group has both values. A metric that has no value in any cell of the selection
(LPIPS without its pretrained weights) is left out of the check, and the note says so.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gradinv.settings import ConfigError
from gradinv.tables.aggregate import METRICS

VERDICTS = ("holds", "fails", "not evaluated")
RELATIONS = ("less", "greater", "better", "within", "not_below")
COLUMNS = (
    "id",
    "paper",
    "source",
    "claim",
    "verdict",
    "satisfied",
    "evaluated",
    "groups",
    "evidence",
    "reason",
    "table",
    "scale",
    "paper_verdict",
)
UTILITY = "utility"  # results/utility.csv: one line per defense, its accuracy columns


class ClaimError(ConfigError):
    """``claims.yaml`` is malformed: the message names the claim, the key and the fix."""


@dataclass(frozen=True)
class Check:
    table: str
    compare: str
    left: str
    right: str
    relation: str
    metrics: tuple[str, ...] = ()
    over: tuple[str, ...] = ()
    where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    tolerance: float = 0.0
    expect: str | float = "all"
    only_where: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    source: str
    claim: str
    check: Check


def load_claims(path: str | os.PathLike[str]) -> list[Claim]:
    """Read and validate ``claims.yaml``: every claim's keys, relation, metrics and id."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ClaimError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise ClaimError(f"{path}: expected a mapping with a list under 'claims'.")
    claims, seen = [], set()
    for i, entry in enumerate(data["claims"]):
        claim = _claim(entry, f"{path}: claims[{i}]")
        if claim.id in seen:
            raise ClaimError(f"{path}: claim id {claim.id!r} is listed twice; ids must be unique.")
        seen.add(claim.id)
        claims.append(claim)
    return claims


def _claim(entry: Any, where: str) -> Claim:
    if not isinstance(entry, dict):
        raise ClaimError(f"{where}: expected a mapping with id, paper, source, claim, check.")
    keys = ("id", "paper", "source", "claim", "check")
    _known(entry, keys, where)
    for key in keys:
        if key not in entry:
            raise ClaimError(f"{where}: missing {key!r}.")
    where = f"{where} ({entry['id']})"
    check = entry["check"]
    if not isinstance(check, dict):
        raise ClaimError(f"{where}: 'check' must be a mapping.")
    _known(check, Check.__dataclass_fields__, f"{where}.check")
    for key in ("table", "compare", "left", "right", "relation"):
        if key not in check:
            raise ClaimError(f"{where}.check: missing {key!r}.")
    if check["relation"] not in RELATIONS:
        raise ClaimError(
            f"{where}.check.relation: {check['relation']!r} is not one of {', '.join(RELATIONS)}."
        )
    metrics = tuple(check.get("metrics", ()))
    unknown = [m for m in metrics if m not in METRICS]
    if unknown and check["table"] != UTILITY:
        raise ClaimError(
            f"{where}.check.metrics: unknown metric(s) {unknown}; known: {', '.join(METRICS)}."
        )
    if check["relation"] == "better" and (not metrics or check["table"] == UTILITY):
        raise ClaimError(f"{where}.check: 'better' needs the metrics of an attack table.")
    expect = check.get("expect", "all")
    if not (expect == "all" or (isinstance(expect, float | int) and 0 < expect <= 1)):
        raise ClaimError(f"{where}.check.expect: 'all' or a fraction in (0, 1], not {expect!r}.")
    if expect != "all" and check.get("only_where"):
        raise ClaimError(f"{where}.check: give 'expect' or 'only_where', not both.")
    return Claim(
        id=str(entry["id"]),
        paper=str(entry["paper"]),
        source=str(entry["source"]),
        claim=" ".join(str(entry["claim"]).split()),
        check=Check(
            table=str(check["table"]),
            compare=str(check["compare"]),
            left=str(check["left"]),
            right=str(check["right"]),
            relation=check["relation"],
            metrics=metrics,
            over=tuple(check.get("over", ())),
            where=_selection(check.get("where", {}), f"{where}.check.where"),
            tolerance=float(check.get("tolerance", 0.0)),
            expect=expect,
            only_where=_selection(check.get("only_where", {}), f"{where}.check.only_where"),
        ),
    )


def _known(entry: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ClaimError(f"{where}: unknown key(s) {unknown}; known: {', '.join(keys)}.")


def _selection(value: Any, where: str) -> dict[str, tuple[Any, ...]]:
    if not isinstance(value, dict):
        raise ClaimError(f"{where}: expected a mapping of column to value(s).")
    return {k: tuple(v) if isinstance(v, list) else (v,) for k, v in value.items()}


def result_file(table: str, results: str | os.PathLike[str] = "results") -> Path:
    """The file a check reads: an attack table's cells, or the utility table."""
    name = "utility.csv" if table == UTILITY else f"{table}_cells.csv"
    return Path(results) / name


# --- evaluation ------------------------------------------------------------------------------


def evaluate(
    claims: Sequence[Claim],
    results: Mapping[str, pd.DataFrame],
    scale: str,
    published: Mapping[str, pd.DataFrame] | None = None,
    missing: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """One line per claim; ``results`` maps a check's table to its frame (absent: not built by
    this configuration); ``scale`` is the run's (embedded or paper), recorded on every line;
    ``published`` maps a table to the paper's numbers in the same layout (``reference_cells``);
    ``missing`` maps a table this configuration builds but whose file is absent to the reason."""
    rows = []
    for claim in claims:
        frame = results.get(claim.check.table)
        if claim.check.table in (missing or {}):
            row = _row(claim, "not evaluated", reason=missing[claim.check.table])
        elif frame is None:
            reason = f"{claim.check.table} is not built by this configuration"
            row = _row(claim, "not evaluated", reason=reason)
        else:
            row = _evaluate(claim, frame)
        paper = (published or {}).get(claim.check.table)
        if paper is not None:
            row["paper_verdict"] = _evaluate(claim, paper)["verdict"]
        rows.append(row)
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS)).assign(scale=scale)


def reference_cells(
    reference: pd.DataFrame, labels: Mapping[str, Mapping[str, str]]
) -> pd.DataFrame:
    """A published table (``dataset, defense, attack, metric, value`` in the paper's names) in
    the layout of ``<table>_cells.csv``: run keys for defenses, attacks and metrics (through
    params.yaml's labels), the paper's dataset names. Lines naming no run of ours are dropped."""
    keys = {
        column: {label: key for key, label in labels[kind].items()}
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
        "satisfied": fields.get("satisfied", 0),
        "evaluated": fields.get("evaluated", 0),
        "groups": fields.get("groups", 0),
        "evidence": fields.get("evidence", ""),
        "reason": fields.get("reason", ""),
        "table": claim.check.table,
        "scale": "",
        "paper_verdict": "",
    }


def _tidy(check: Check, frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as (group columns..., compare column, metric, value)."""
    if check.table == UTILITY:
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
    return sub.rename(columns={"mean": "value"})


def _as_text(tidy: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """Key columns as text, as claims.yaml names them (a round 9 is "9", not 9.0)."""
    out = tidy.copy()
    for c in columns:
        if c in out.columns:
            out[c] = [_key(v) for v in out[c]]
    return out


def _key(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _evaluate(claim: Claim, frame: pd.DataFrame) -> dict[str, Any]:
    check = claim.check
    keys = {check.compare, *check.over, *check.where, *check.only_where}
    tidy = _tidy(check, frame)
    absent = [c for c in sorted(keys) if c not in tidy.columns]
    if absent:
        raise ClaimError(f"{claim.id}: {check.table} has no column(s) {absent}.")
    tidy = _as_text(_with_constant_context(tidy, check.over), keys)
    for column, values in check.where.items():
        tidy = tidy[tidy[column].isin([_key(v) for v in values])]
    notes = []
    if check.metrics and check.table != UTILITY:
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
        outcomes.append((group_key, *_compare(check, _group_name(group_key), group)))
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
        wrong = [_group_name(g) for g, ok, _ in evaluated if ok != _matches(g, check.only_where)]
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
    parts = ", ".join(f"{r} {_fmt(v)}" for r, v in rights)
    mark = "yes" if all(results) else "no"
    return all(results), f"{name}: {check.left} {_fmt(left)} vs {parts} ({mark})"


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
    return abs(left - right) <= check.tolerance


def _group_name(key: Mapping[str, Any]) -> str:
    return "/".join(str(v) for v in key.values()) or "all"


def _matches(key: Mapping[str, Any], selection: Mapping[str, tuple[Any, ...]]) -> bool:
    return all(key.get(column) in {_key(v) for v in vs} for column, vs in selection.items())


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any) -> str:
    return f"{float(value):.4g}"


# --- rendering -------------------------------------------------------------------------------


def markdown(table: pd.DataFrame, scale: str) -> str:
    """``results/claims.md``: the verdicts first, then every claim with its numbers."""
    counts = table["verdict"].value_counts()
    lines = [
        "# The papers' claims, checked against this run",
        "",
        f"Scale of the run: **{scale}**."
        + (
            " SCALED-DOWN: the embedded setting (small model, embedded data, short attacks) "
            "tests each claim on a setting the papers did not use; a claim that fails here is "
            "a finding about this run, not a refutation of the paper."
            if scale != "paper"
            else ""
        ),
        "",
        ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS) + f" of {len(table)} claims.",
        "",
        "`groups`: in how many of the compared groups (dataset, attack, metric, ...) the "
        "relation held, of those with both values (a group without them never counts for a "
        "claim); `on the paper's numbers`: the same check on the published table, where there "
        "is one (it tests how the claim is encoded).",
        "",
        "| claim | paper | source | verdict | groups | on the paper's numbers |",
        "|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        groups = f"{r.satisfied}/{r.evaluated}" if r.evaluated else "-"
        if r.evaluated and r.groups > r.evaluated:
            groups += f" ({r.groups - r.evaluated} without values)"
        lines.append(
            f"| `{r.id}` | {r.paper} | {r.source} | **{r.verdict}** | {groups} | "
            f"{r.paper_verdict or '-'} |"
        )
    lines.append("")
    for r in table.itertuples(index=False):
        lines += [f"## `{r.id}`: {r.verdict}", "", f"> {r.claim}", ""]
        lines.append(f"{r.paper}, {r.source}; checked on `{r.table}`.")
        if r.reason:
            lines += ["", f"Note: {r.reason}."]
        if r.evidence:
            lines += ["", *(f"- {part}" for part in str(r.evidence).split("; "))]
        lines.append("")
    return "\n".join(lines)
