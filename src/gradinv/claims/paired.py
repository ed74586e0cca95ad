"""A claim's verdict on this run: paired comparisons on the same victims (or seeds), with intervals.

For each group of the check (``over``: dataset, attack, metric, ...), the two sides of the
comparison (two defenses, two attacks, two rounds) are paired on the same victim, and the mean
of the paired differences left − right comes with its 95% interval
(:func:`gradinv.stats.paired_victims`: the exact sign-flip interval; over training seeds,
:func:`gradinv.stats.paired_seeds`). The group's verdict reads the interval against the claimed
side (:func:`gradinv.stats.verdict`): **holds** when it lies on the claimed side, **fails** when
it lies on the other, **inconclusive** otherwise. ``better`` takes the side from the metric's
arrow. ``others`` compares against every other value, each its own comparison; the group holds
only if every one holds, fails if any fails.

**Undecidable at this scale.** A group over an attack that does not beat the floor (the public
split's mean image, :mod:`gradinv.tables.floor`) on the median undefended victim is
*undecidable*: that attack recovered nothing a defense could take away. The undefended run is
looked up with the same dataset, model, attack, round and batch size, in this table or any
other; a round without one falls back to the earliest round with one, and a group with none
anywhere is decided without the check: the group's evidence says either. A metric the floor
does not score is checked through the one it derives from (attack success: SSIM).

**How the groups combine** into the claim's verdict, over the decidable groups (a claim with
none is undecidable):

- ``expect: all`` (the default): holds if every group holds, fails if any fails, else
  inconclusive;
- ``expect: f``: holds if at least ⌈f·k⌉ of the k groups hold, fails if so many fail that ⌈f·k⌉
  can no longer hold, else inconclusive;
- ``only_where``: holds if the relation holds in every named group and fails in every other,
  fails if it fails in a named group or holds in another, else inconclusive.

A group without both values is not a group of the comparison (it is counted in the note); a
claim with none is *not evaluated*, as is one on a table this run did not build. Where ``others``
makes several comparisons and only some of them have pairs (every run of one defense failed),
the group is decided on those, and cannot hold without the rest: it fails if one fails, and is
inconclusive otherwise.

**What would decide it.** An inconclusive comparison's evidence says about how many victims (or
seeds) in all would decide it (:func:`gradinv.stats.units_to_decide`: the paired sample size
that decides it with 80% power if its observed mean and spread held) and which way (its verdict
at the mean). An inconclusive claim's ``to_decide`` gives the fewest victims a group at which,
with every group that needs at most that many decided its way, the claim's combination is
decided (for ``expect: 0.8`` that may need only some of its groups; one failing group fails an
``all`` claim). An undecidable claim needs a stronger attack rather than more victims: a budget
at which the undefended attack beats the floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

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
from gradinv.stats import (
    POWER,
    SIGN_FLIP_MIN,
    Interval,
    paired_seeds,
    paired_victims,
    units_to_decide,
    verdict,
)
from gradinv.tables.aggregate import METRICS, training_scope
from gradinv.tables.files import JOB_KEYS
from gradinv.tables.floor import FLOORED, UNDEFENDED, floor_check

GROUP_VERDICTS = ("holds", "fails", "inconclusive", "undecidable")
# A PSNR is paired as at most this many dB, an exact reconstruction's +inf (MSE 0) included: a
# reconstruction that close is closer to the victim than the victim's own 8-bit rounding (a
# uniform error of a 1/255 step: 58.9 dB), so no image file tells two of them apart, and a
# victim at 135 dB under one defense and exact under another is no difference at all.
PSNR_CEILING = 60.0
FLOOR_KEYS = ("dataset", "model", "attack", "round", "batch_size")
# A victim's run: the tables that share it list it once each, with the same values
VICTIM_KEYS = (*FLOOR_KEYS, "defense", "victim")
# The floored metric a claim's metric is checked through when the floor does not score it: the
# attack success rate is the share of a victim's images above an SSIM threshold
FLOOR_PROXY = {"attack_success": "ssim"}
# What would decide a claim whose every group is undecidable
UNDECIDABLE_NEEDS = (
    "a stronger attack rather than more victims: an attack budget at which the undefended "
    "attack beats the floor (each group gives its median gain over the floor)"
)


def evaluate_paired(
    claim: Claim,
    frame: pd.DataFrame,
    undefended: pd.DataFrame | None = None,
    training: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The claim's verdict, its groups' counts and the evidence, on one result frame: a table's
    per-victim values (``<table>_victims.csv``) or the utility runs (one line per defense and
    seed). ``undefended``: every table's per-victim values, where the floor checks look;
    ``training``: the table's accuracy and PMM seed by seed (``<table>_training.csv``), what a
    check on those metrics pairs."""
    check = claim.check
    if (
        not is_utility(check.table)
        and check.metrics
        and all(training_scope(m) for m in check.metrics)
    ):
        if training is None:
            return _result("not evaluated", [f"{check.table} has no training runs' values"])
        frame, seeds = training.assign(status="ok"), True
    else:
        seeds = is_utility(check.table)
    tidy, pair_on = _tidy(check, frame, seeds)
    keys = {check.compare, *check.over, *check.where, *check.only_where}
    absent = [c for c in sorted(keys) if c not in tidy.columns]
    if absent:
        raise ClaimError(f"{claim.id}: {check.table} has no column(s) {absent}.")
    tidy = as_text(tidy, keys)
    for column, values in check.where.items():
        tidy = tidy[tidy[column].isin([key_text(v) for v in values])]
    if tidy.empty:
        return _result("not evaluated", [f"no run of {check.table} matches 'where' {check.where}"])
    notes: list[str] = []
    tidy, dropped = _without_metrics_never_computed(check, tidy)
    notes += dropped
    if tidy.empty:
        return _result(
            "not evaluated", [*notes, "no value matches the check's metrics and 'where'"]
        )
    over = [*check.over, *(["metric"] if tidy["metric"].nunique() > 1 else [])]
    groups = list(tidy.groupby(over, sort=False, dropna=False)) if over else [((), tidy)]
    outcomes = []  # (group key, verdict or None, text, plan: what would decide it)
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        group_key = dict(zip(over, key, strict=True))
        outcomes.append((group_key, *_group(claim, group_key, group, pair_on, undefended, seeds)))
    evaluated = [o[:3] for o in outcomes if o[1] is not None]
    counts = {v: sum(1 for _, g, _ in evaluated if g == v) for v in GROUP_VERDICTS}
    evidence = "; ".join(text for _, _, text, _ in outcomes)
    skipped = len(outcomes) - len(evaluated)
    if skipped:
        notes.append(f"{skipped} of {len(outcomes)} group(s) without both values")
    if not evaluated:
        return _result("not evaluated", [*notes, "no group has both values"], counts, evidence)
    decidable = [(g, v) for g, v, _ in evaluated if v != "undecidable"]
    if not decidable:
        notes.append(
            "every group's attack fails to beat the floor without a defense: nothing a defense "
            "could lower"
        )
        return _result("undecidable", notes, counts, evidence, UNDECIDABLE_NEEDS)
    if counts["undecidable"]:
        notes.append(
            f"{counts['undecidable']} group(s) undecidable (the attack does not beat the floor "
            "without a defense), left out"
        )
    combined = _combine(check, decidable)
    if combined != "inconclusive":
        return _result(combined, notes, counts, evidence)
    keys = [g for g, _ in decidable]
    plans = [(v, plan) for _, v, _, plan in outcomes if v not in (None, "undecidable")]
    plan = _earliest(
        plans, lambda verdicts: _combine(check, list(zip(keys, verdicts, strict=True)))
    )
    return _result(combined, notes, counts, evidence, _to_decide(plan, seeds))


@dataclass(frozen=True)
class Plan:
    """What would decide an inconclusive comparison, group or claim: about ``units`` victims (or
    seeds) in all (None: no estimate), and the verdict it would then reach if the observed
    means held (``then``)."""

    units: int | None
    then: str = "inconclusive"


def _earliest(items: list[tuple[str, Plan | None]], combine: Callable[[list[str]], str]) -> Plan:
    """The fewest units at which ``combine`` of the items' verdicts is decided, when each
    inconclusive item whose plan needs at most that many reaches its planned verdict (a decided
    item keeps its own): a claim over several groups may need only some of them decided."""
    for units in sorted({p.units for v, p in items if v == "inconclusive" and p and p.units}):
        then = [
            p.then if v == "inconclusive" and p and p.units and p.units <= units else v
            for v, p in items
        ]
        verdict_ = combine(then)
        if verdict_ != "inconclusive":
            return Plan(units, verdict_)
    return Plan(None)


def _to_decide(plan: Plan, seeds: bool) -> str:
    """The claim's ``to_decide`` for its plan."""
    unit = "seeds" if seeds else "victims"
    if plan.units is None:
        return (
            f"no estimate of the {unit} that would decide it: a group it needs has its mean "
            "difference practically on the boundary, or a single pair"
        )
    outcome = "hold" if plan.then == "holds" else "fail"
    return (
        f"about {plan.units:,} {unit} a group in all, not {plan.units:,} more (the groups "
        f"that need at most that many are then decided, each with {POWER:.0%} power, if their "
        f"observed means and spreads held; the claim would then {outcome})"
    )


def _combine(check: Check, groups: list[tuple[dict[str, Any], str]]) -> str:
    """The claim's verdict from its decidable groups' (module docstring)."""
    verdicts = [v for _, v in groups]
    if check.only_where:
        named = [v for g, v in groups if matches(g, check.only_where)]
        other = [v for g, v in groups if not matches(g, check.only_where)]
        if "fails" in named or "holds" in other:
            return "fails"
        return (
            "holds"
            if all(v == "holds" for v in named) and all(v == "fails" for v in other)
            else "inconclusive"
        )
    fraction = 1.0 if check.expect == "all" else float(check.expect)
    need = math.ceil(fraction * len(verdicts) - 1e-9)
    holds, fails = verdicts.count("holds"), verdicts.count("fails")
    if holds >= need:
        return "holds"
    if fails > len(verdicts) - need:
        return "fails"
    return "inconclusive"


def _group(
    claim: Claim,
    key: Mapping[str, Any],
    group: pd.DataFrame,
    pair_on: list[str],
    undefended: pd.DataFrame | None,
    seeds: bool,
) -> tuple[str | None, str, Plan | None]:
    """One group's verdict (None: no comparison of it shares a victim or seed), its evidence, and,
    when inconclusive, what would decide it; ``seeds``: the pairs are training seeds, not
    victims."""
    check, name = claim.check, group_name(key)
    metric = str(group["metric"].iloc[0])
    sides = {str(k): g for k, g in group.groupby(check.compare, sort=False)}
    rights = [r for r in sides if r != check.left] if check.right == "others" else [check.right]
    left = sides.get(check.left)
    missing = [n for n in [check.left, *rights] if n not in sides]
    if left is None or missing or not rights:
        return None, f"{name}: no values for {', '.join(missing or [check.right])}", None
    relation = _relation(check.relation, metric)
    floor_note, caveat = (None, None) if seeds else _floor(check, group, metric, undefended, rights)
    caveat = f" ({caveat})" if caveat else ""
    if floor_note is not None:
        return "undecidable", f"{name}: undecidable ({floor_note}){caveat}", None
    results, texts = [], []  # (verdict, plan) of each comparison, and its text
    unpaired = 0
    for right in rights:
        pairs = _pairs(left, sides[right], pair_on, metric)
        if pairs.empty:  # e.g. every run of one side failed: this comparison cannot be made,
            # and the group cannot hold without it (it still fails if another fails)
            unpaired += 1
            results.append(("inconclusive", None))
            texts.append(f"{check.left} and {right} share no {'/'.join(pair_on)} with both values")
            continue
        interval = _interval(claim, name, right, pairs, seeds)
        result = verdict(interval, relation, check.tolerance)
        text = f"{check.left} − {right} {_describe(interval)}"
        plan = None
        if result == "inconclusive":
            plan = _plan(pairs["left"] - pairs["right"], interval, relation, check.tolerance, seeds)
            text += f", {_plan_text(plan, seeds)}"
        results.append((result, plan))
        texts.append(text)
    if unpaired == len(rights):
        return None, f"{name}: {' | '.join(texts)}", None
    group_verdict = _group_verdict([v for v, _ in results])
    plan = _earliest(results, _group_verdict) if group_verdict == "inconclusive" else None
    return group_verdict, f"{name}: {' | '.join(texts)}: {group_verdict}{caveat}", plan


def _group_verdict(verdicts: list[str]) -> str:
    """A group's verdict from its comparisons' (``right: others`` makes several)."""
    if "fails" in verdicts:
        return "fails"
    return "holds" if set(verdicts) == {"holds"} else "inconclusive"


def _plan(
    differences: pd.Series, interval: Interval, relation: str, tolerance: float, seeds: bool
) -> Plan:
    """What would decide an inconclusive comparison: the victims (or seeds) in all, more than
    it has (:func:`gradinv.stats.units_to_decide`), and the verdict at its observed mean."""
    units = units_to_decide(
        differences.to_numpy(float),
        relation,
        tolerance,
        minimum=len(differences) + 1 if seeds else max(SIGN_FLIP_MIN, len(differences) + 1),
        sign_flip=not seeds,
    )
    at_mean = Interval(interval.estimate, interval.estimate, interval.estimate, 1, "mean")
    return Plan(units, verdict(at_mean, relation, tolerance))


def _plan_text(plan: Plan, seeds: bool) -> str:
    unit = "seeds" if seeds else "victims"
    if plan.units is None:
        return f"no estimate of the {unit} that would decide it"
    return f"about {plan.units:,} {unit} in all would decide it ({plan.then} at its mean)"


def _interval(claim: Claim, name: str, right: str, pairs: pd.DataFrame, seeds: bool) -> Interval:
    left, right_values = pairs["left"].to_numpy(float), pairs["right"].to_numpy(float)
    if seeds:
        return paired_seeds(left, right_values)
    return paired_victims(left, right_values, claim.id, name, right)


def _pairs(
    left: pd.DataFrame, right: pd.DataFrame, pair_on: list[str], metric: str
) -> pd.DataFrame:
    """The values of the two sides on the same victims (or seeds), the unusable ones dropped: a
    failed run, a NaN. A PSNR counts as at most :data:`PSNR_CEILING` (exact ones too)."""
    columns = [c for c in pair_on if c in left.columns and c in right.columns]
    merged = left[[*columns, "value"]].merge(
        right[[*columns, "value"]], on=columns, suffixes=("_l", "_r")
    )
    merged = merged.rename(columns={"value_l": "left", "value_r": "right"})
    for side in ("left", "right"):
        merged[side] = merged[side].astype(float)
        if metric == "psnr":
            merged[side] = merged[side].clip(upper=PSNR_CEILING)
    return merged[np.isfinite(merged["left"]) & np.isfinite(merged["right"])]


def _floor(
    check: Check,
    group: pd.DataFrame,
    metric: str,
    undefended: pd.DataFrame | None,
    rights: list[str],
) -> tuple[str | None, str | None]:
    """Why the group is undecidable (an attack of it does not beat the floor without a
    defense), or None; and what its evidence says of the check itself, or None: the round it
    fell back to, or that no undefended run was found to check."""
    floored = metric if metric in FLOORED else FLOOR_PROXY.get(metric)
    if floored is None or undefended is None or undefended.empty:
        return None, None
    sides = [check.left, *rights]
    context = {c: _single(group, c) for c in FLOOR_KEYS if c != check.compare}
    attacks = sides if check.compare == "attack" else [context.get("attack")]
    rounds = sides if check.compare == "round" else [context.get("round")]
    label = METRICS[floored].label
    failing, caveats, seen = [], [], set()
    for attack in attacks:
        for rnd in rounds:
            cells = _undefended(undefended, {**context, "attack": attack, "round": rnd})
            name = attack if attack is not None else "attack"  # a group over several attacks
            if cells is None:
                caveats.append(f"the floor not checked: no undefended {name} run")
                continue
            checked = key_text(cells["round"].iloc[0])
            if (attack, checked) in seen:  # two rounds falling back to the same cells
                continue
            seen.add((attack, checked))
            at = f"round {checked}"
            if checked != key_text(rnd):
                at += f" (none at round {rnd})"
            result = floor_check(cells, floored)
            if result.beats is False:
                failing.append(
                    f"undefended {name} at {at} does not beat the floor in {label} "
                    f"(median gain {result.median_gain:+.3g}, {result.n} victims)"
                )
            elif result.n == 0:
                caveats.append(f"the floor not checked: undefended {name} has no {label} values")
            elif checked != key_text(rnd):
                caveats.append(f"the floor checked on undefended {name} at {at}")
    return " | ".join(failing) or None, "; ".join(dict.fromkeys(caveats)) or None


def _undefended(victims: pd.DataFrame, context: Mapping[str, Any]) -> pd.DataFrame | None:
    """The undefended victims of an attack cell: the same keys, else the earliest round; each
    victim once, however many tables read its run (Table I's victims are also CENSOR's
    variants', CVB's and the frontier's: a victim counted once per table would weigh the
    median gain towards the victims the most tables share)."""
    rows = victims[victims["defense"] == UNDEFENDED]
    # one row a victim, each column its first value any table gives: a table that does not
    # score a metric (Refiner's Fig. 6 scores PSNR only) leaves it to one that does (Fig. 9's
    # noise ratio, on the same runs)
    rows = rows.groupby(list(VICTIM_KEYS), sort=False, dropna=False).first().reset_index()
    for column in ("dataset", "model", "attack", "batch_size"):
        if context.get(column) is not None:
            rows = rows[rows[column].astype(str) == str(context[column])]
    if rows.empty:
        return None
    same = rows[rows["round"].astype(str) == str(context.get("round"))]
    if not same.empty:
        return same
    earliest = rows["round"].astype(int).min()
    return rows[rows["round"].astype(int) == earliest]


def _relation(relation: str, metric: str) -> str:
    if relation != "better":
        return relation
    return "greater" if METRICS[metric].arrow == "↑" else "less"


def _tidy(check: Check, frame: pd.DataFrame, seeds: bool) -> tuple[pd.DataFrame, list[str]]:
    """The frame as one value per (keys..., metric) and the columns a pair shares: a victim (its
    job keys but the compared one), or a seed (the utility runs, a table's training values)."""
    if seeds:
        metrics = check.metrics or ("accuracy",)
        missing = [m for m in metrics if m not in frame.columns]
        if missing:
            raise ClaimError(f"the utility runs have no column(s) {missing}.")
        frame = frame if "seed" in frame.columns else frame.assign(seed=0)
        ok = frame[frame.get("status", pd.Series("ok", index=frame.index)) == "ok"]
        tidy = ok.melt(
            id_vars=[c for c in ok.columns if c not in metrics],
            value_vars=list(metrics),
            var_name="metric",
            value_name="value",
        )
        return tidy, [c for c in ("dataset", "model", "seed") if c != check.compare]
    base = [c for c in (*JOB_KEYS, "status") if c in frame.columns]
    ok = frame["status"] == "ok" if "status" in frame.columns else True
    parts = [
        frame[base].assign(metric=metric, value=frame[metric].where(ok))
        for metric in check.metrics
        if metric in frame.columns
    ]
    if not parts:
        return frame[base].assign(metric=pd.Series(dtype=str), value=math.nan).iloc[0:0], []
    tidy = pd.concat(parts, ignore_index=True)
    pair_on = [c for c in JOB_KEYS if c != check.compare]
    return tidy, pair_on


def _without_metrics_never_computed(
    check: Check, tidy: pd.DataFrame
) -> tuple[pd.DataFrame, list[str]]:
    """The values less the metrics this run could not compute anywhere (LPIPS without its
    weights): the claim is checked on the others, and the note says so."""
    notes = []
    for metric in check.metrics:
        values = tidy.loc[tidy["metric"] == metric, "value"]
        if values.empty or values.isna().all():
            notes.append(
                f"{metric} has no value in this run (unavailable, never computed, or every "
                "run failed)"
            )
            tidy = tidy[tidy["metric"] != metric]
    return tidy, notes


def _result(
    verdict_: str,
    notes: list[str],
    counts: Mapping[str, int] | None = None,
    evidence: str = "",
    to_decide: str = "",
) -> dict[str, Any]:
    counts = dict(counts or {})
    return {
        "verdict": verdict_,
        **{f"{v}_groups": counts.get(v, 0) for v in GROUP_VERDICTS},
        "evidence": evidence,
        "reason": "; ".join(notes),
        "to_decide": to_decide,
    }


def _describe(interval: Interval) -> str:
    def fmt(x: float) -> str:
        return "∞" if x == math.inf else "−∞" if x == -math.inf else f"{x:.4g}".replace("-", "−")

    unit = "victims" if interval.method.startswith("sign-flip") else "seeds"
    bounds = f"[{fmt(interval.low)}, {fmt(interval.high)}]"
    return f"{fmt(interval.estimate)} {bounds} (n {interval.n} {unit})"


def _single(group: pd.DataFrame, column: str) -> Any:
    if column not in group.columns:
        return None
    values = group[column].dropna().unique()
    return values[0] if len(values) == 1 else None
