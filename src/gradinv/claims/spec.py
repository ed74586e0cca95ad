"""``workflow/claims.yaml`` read and validated: each claim, its source and its check.

The format is described in ``gradinv.claims``; an unknown key, relation or metric is a
``ClaimError`` that names the claim, the key and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gradinv.config_files import safe_yaml
from gradinv.settings import ConfigError
from gradinv.tables.aggregate import METRICS, training_scope
from gradinv.tables.files import SEED_COLUMNS, VICTIM_COLUMNS

RELATIONS = ("less", "greater", "better", "within", "not_below")
UTILITY = "utility"  # the utility study's runs (utility_runs.csv); utility_<recipe>: a recipe's
# What a check on the utility runs can compare, group and select on: their columns that are no
# metric (stages/utility.py RUN_COLUMNS)
UTILITY_KEYS = ("defense", "label", "seed")


def is_utility(table: str) -> bool:
    """Whether a check reads training runs (``utility``, or ``utility_<recipe>``: the runs of a
    paper's own recipe, params.yaml ``recipes``) rather than an attack table."""
    return table == UTILITY or table.startswith(f"{UTILITY}_")


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
        data = safe_yaml(Path(path).read_text(encoding="utf-8"))
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
    if unknown and not is_utility(check["table"]):
        raise ClaimError(
            f"{where}.check.metrics: unknown metric(s) {unknown}; known: {', '.join(METRICS)}."
        )
    if check["relation"] == "better" and (not metrics or is_utility(check["table"])):
        raise ClaimError(f"{where}.check: 'better' needs the metrics of an attack table.")
    expect = check.get("expect", "all")
    if not (expect == "all" or (isinstance(expect, float | int) and 0 < expect <= 1)):
        raise ClaimError(f"{where}.check.expect: 'all' or a fraction in (0, 1], not {expect!r}.")
    if expect != "all" and check.get("only_where"):
        raise ClaimError(f"{where}.check: give 'expect' or 'only_where', not both.")
    _keys_in_file(check, metrics, f"{where}.check")
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


def _keys_in_file(check: Mapping[str, Any], metrics: tuple[str, ...], where: str) -> None:
    """Every column the check compares, groups or selects on is one of the file it reads:
    caught when the workflow is built, not when the claims job runs at the end of a long run.
    A table's accuracy and PMM come from its training runs, one line per defense and seed
    (``<table>_training.csv``): the same for every attack, round and victim of the table."""
    table = str(check["table"])
    seeded = [m for m in metrics if training_scope(m)]
    if is_utility(table):
        columns, name = UTILITY_KEYS, f"{table}_runs.csv"
    elif seeded and len(seeded) < len(metrics):
        raise ClaimError(
            f"{where}.metrics: {seeded} come from the training runs and "
            f"{[m for m in metrics if m not in seeded]} from the attacks; give each kind a "
            "claim of its own."
        )
    elif seeded:
        columns, name = SEED_COLUMNS, f"{table}_training.csv"
    else:
        columns, name = VICTIM_COLUMNS, f"{table}_victims.csv"
    keys = [
        str(check["compare"]),
        *check.get("over", ()),
        *check.get("where", {}),
        *check.get("only_where", {}),
    ]
    absent = sorted({k for k in keys if k not in (*columns, "metric")})
    if absent:
        why = (
            f" ({', '.join(seeded)}: one value per defense and seed, the same for every attack)"
            if seeded
            else ""
        )
        raise ClaimError(
            f"{where}: {name} has no column(s) {absent}{why}; compare, over, where and "
            f"only_where name its columns: {', '.join(columns)}."
        )


def _known(entry: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
    unknown = sorted(set(entry) - set(keys))
    if unknown:
        raise ClaimError(f"{where}: unknown key(s) {unknown}; known: {', '.join(keys)}.")


def _selection(value: Any, where: str) -> dict[str, tuple[Any, ...]]:
    if not isinstance(value, dict):
        raise ClaimError(f"{where}: expected a mapping of column to value(s).")
    return {k: tuple(v) if isinstance(v, list) else (v,) for k, v in value.items()}


def training_file(table: str, results: str | os.PathLike[str] = "results") -> Path:
    """An attack table's accuracy and PMM seed by seed, what a check on them pairs."""
    return Path(results) / f"{table}_training.csv"


def result_file(table: str, results: str | os.PathLike[str] = "results") -> Path:
    """The file a check reads: an attack table's per-victim values, or a utility study's runs
    (one line per defense and seed)."""
    name = f"{table}_runs.csv" if is_utility(table) else f"{table}_victims.csv"
    return Path(results) / name


def as_text(tidy: Any, columns: Iterable[str]) -> Any:
    """A frame's key columns as text, as claims.yaml names them (a round 9 is "9", not 9.0)."""
    out = tidy.copy()
    for c in columns:
        if c in out.columns:
            out[c] = [key_text(v) for v in out[c]]
    return out


def key_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def group_name(key: Mapping[str, Any]) -> str:
    """A group as the evidence names it: its values joined by / ("patches/ig")."""
    return "/".join(str(v) for v in key.values()) or "all"


def matches(key: Mapping[str, Any], selection: Mapping[str, tuple[Any, ...]]) -> bool:
    """Whether a group lies in ``selection`` (a check's ``only_where``)."""
    return all(key.get(column) in {key_text(v) for v in vs} for column, vs in selection.items())
