"""The human-readable companion of a table CSV: cells, caveats, comparison and provenance.

The Markdown is what a reader opens first, so everything that changes how the numbers may be read
is stated here in words, loudly: a scaled-down run, an unavailable metric, failed victims, and
whether there was anything in the paper to compare against. It holds no timestamp, so reruns on
the same metrics files give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gradinv.stats import RESAMPLES
from gradinv.tables.aggregate import metric_header, metric_spec, raw_text

ARROWS_LINE = (
    "Arrows follow CENSOR: ↑ higher is better for the defender, ↓ lower is better for the "
    "defender (MSE↑ LPIPS↑ PSNR↓ SSIM↓)."
)


def _esc(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def format_cell(rec: Mapping[str, Any]) -> str:
    """``mean ± std [low, high] (n)``: the 95% interval in brackets (none for one victim), in
    parentheses ``, k exact``, ``, k failed`` and ``, k not scored`` where k > 0, then ``≤ floor``
    where the median victim's reconstruction is no closer than the floor's; ``n/a`` for an
    unavailable metric."""
    decimals = metric_spec(rec["metric"]).decimals
    n, failed = int(rec["n"]), int(rec["failed"])
    exact, unscored = int(rec.get("exact") or 0), int(rec.get("not_scored") or 0)
    counts = ", ".join(
        [f"{n}"]
        + ([f"{exact} exact"] if exact else [])
        + ([f"{failed} failed"] if failed else [])
        + ([f"{unscored} not scored"] if unscored else [])
    )
    if n == 0:
        if int(rec["unavailable"]):
            return f"n/a ({failed} failed)" if failed else "n/a"
        if failed or unscored:
            return f"— ({counts})"
        return "no runs"
    mean = _number(rec["mean"], decimals)  # ∞: exact reconstructions (PSNR)
    std = rec["std"]
    text = mean if _missing(std) else f"{mean} ± {std:.{decimals}f}"
    low, high = rec.get("ci_low"), rec.get("ci_high")
    if not (_missing(low) or _missing(high)):
        text += f" [{_number(low, decimals)}, {_number(high, decimals)}]"
    gain = rec.get("floor_gain")
    at_floor = int(rec.get("floor_n") or 0) > 0 and not _missing(gain) and gain <= 0
    return f"{text} ({counts})" + (" ≤ floor" if at_floor else "")


def _number(value: float, decimals: int) -> str:
    return "∞" if value == math.inf else f"{value:.{decimals}f}"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _cell_tables(long: pd.DataFrame, rows: Sequence[str]) -> list[str]:
    """One Markdown table per attack: the paper's wide row would be ~22 columns, unreadable."""
    out: list[str] = []
    metrics = list(dict.fromkeys(long["metric"]))
    for attack in dict.fromkeys(long["attack_label"]):
        part = long[long["attack_label"] == attack]
        # CENSOR under Algorithm 1: how many victims' updates were the raw gradient
        raw = "raw_recorded" in part.columns and bool((part["raw_recorded"] > 0).any())
        extra = ["raw gradient shared"] if raw else []
        out += [f"### {attack}", ""]
        out.append("| " + " | ".join([*rows, *(metric_header(m) for m in metrics), *extra]) + " |")
        out.append("|" + "---|" * len(rows) + "---:|" * (len(metrics) + len(extra)))
        line_keys = dict.fromkeys(tuple(r) for r in part[list(rows)].itertuples(index=False))
        for key in line_keys:
            sel = part[(part[list(rows)] == pd.Series(key, index=list(rows))).all(axis=1)]
            by_metric = {r["metric"]: r for r in sel.to_dict("records")}
            first = next(iter(by_metric.values()))
            labels = [_esc(first[f"{c}_label"]) for c in rows]
            cells = [format_cell(by_metric[m]) for m in metrics]
            cells += [raw_text(first) or "—"] if raw else []
            out.append("| " + " | ".join(labels + cells) + " |")
        out.append("")
    return out


def _inside_count(comparison: pd.DataFrame) -> str:
    """`` (inside: k of m cells with an interval)``, or nothing when none has one."""
    known = comparison["paper_in_interval"].dropna()
    if known.empty:
        return ""
    inside = int(known.astype(bool).sum())
    return f" (the paper's value inside our interval: {inside} of {len(known)} cells with one)"


def _floor_section(floor: pd.DataFrame | None) -> list[str]:
    """Whether each attack, undefended, beats the floor on the median victim (the claims over an
    attack that does not are undecidable at this scale)."""
    lines = ["## Does each attack work without a defense?", ""]
    if floor is None or floor.empty:
        return [
            *lines,
            "Neither this table nor another table of this run has an undefended run of its "
            "attacks scored on a metric the floor scores: whether its attacks work at all is not "
            "measured here.",
            "",
        ]
    elsewhere = "source" in floor.columns and (floor["source"] == "another table").any()
    lines += [
        "Each undefended attack against the *floor*, the public split's mean image scored "
        "against the same victims: the median over victims of the attack's gain (how much "
        "closer its reconstruction is than the floor; positive: the attack does better). An "
        "attack that does not beat the floor on the median victim recovered nothing a defense "
        "could take away, so **the claims over it are undecidable at this scale**."
        + (
            " An attack this table shows only under a defense is read from another table's "
            "undefended run of it (the same dataset, model, batch size and settings; its round, "
            "else the earliest one attacked), marked †."
            if elsewhere
            else ""
        ),
        "",
        "| dataset | model | round | attack | metric | median gain over the floor (n) | "
        "beats the floor |",
        "|---|---|---|---|---|---:|---|",
    ]
    for r in floor.to_dict("records"):
        spec = metric_spec(r["metric"])
        gain = "—" if r["n"] == 0 else f"{r['median_gain']:+.{spec.decimals}f} ({r['n']})"
        answer = {True: "yes", False: "**no**", None: "no victim scored"}[r["beats_floor"]]
        mark = " †" if r.get("source") == "another table" else ""
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['round']} | {_esc(r['attack_label'])}{mark} | "
            f"{spec.label} | {gain} | {answer} |"
        )
    return [*lines, ""]


def _warnings(long: pd.DataFrame) -> list[str]:
    """Loud notes for metrics that are unavailable in some or all cells."""
    out = []
    for metric in dict.fromkeys(long["metric"]):
        part = long[(long["metric"] == metric) & (long["note"] != "no runs")]
        label = metric_spec(metric).label
        hit = part[part["unavailable"] > 0]
        if hit.empty:
            continue
        reasons = "; ".join(dict.fromkeys(n.split(" | ")[0] for n in hit["note"]))
        scope = "in every cell" if len(hit) == len(part) else f"in {len(hit)} cell(s)"
        out += [
            f"> **{label} UNAVAILABLE {scope}.** {_esc(reasons)}. Those runs are left out "
            f"of the {label} cells (`n/a` where no run had it), not counted as zero.",
            "",
        ]
    return out


def _training_note(long: pd.DataFrame) -> list[str]:
    """Where the metrics of scope ``training`` (accuracy, PMM) come from, when shown."""
    shown = [m for m in dict.fromkeys(long["metric"]) if metric_spec(m).scope == "training"]
    if not shown:
        return []
    labels = " and ".join(metric_spec(m).label for m in shown)
    failed = long[long["metric"].isin(shown) & (long["failed"] > 0)]
    reasons = "; ".join(dict.fromkeys(n.split(": ", 1)[-1] for n in failed["note"]))
    return [
        f"{labels}: from each defense's FL training runs (the utility study's, with its FL "
        "setting, at each of its seeds), not from the attacks: the test accuracy (%) at the end "
        "of training and its ratio to the accuracy without a defense at the same seed "
        "(Refiner's PMM); the mean over the seeds with its 95% t-interval and n the seeds, the "
        "same in every attack's column."
        + (f" **Failed training runs:** {_esc(reasons)}." if reasons else ""),
        "",
    ]


def render_markdown(
    long: pd.DataFrame,
    *,
    title: str,
    rows: Sequence[str],
    setting: Mapping[str, Any],
    scaled_down: bool,
    reproduces: str,
    scaled_down_note: str,
    comparison: pd.DataFrame,
    reference_name: str | None,
    failed_runs: pd.DataFrame,
    csv_name: str,
    vs_paper_name: str,
    figure_name: str,
    cells_name: str,
    no_reference: str = "",
    floor: pd.DataFrame | None = None,
) -> str:
    """The full Markdown text of a table (see the module docstring for what it must say)."""
    lines = [
        f"# {title}",
        "",
        ARROWS_LINE,
        "",
        "Cells: mean ± std over victims (sample std, ddof=1; omitted for a single victim and "
        "for a mean of ∞), [the 95% interval of the mean: a percentile bootstrap over the "
        f"victims, {RESAMPLES:,} resamples, seeded by the cell; none for a single victim, of "
        "zero width where every victim gave the same value], and in parentheses n = victims "
        "averaged, then `k exact` = of those, victims reconstructed exactly (MSE 0, PSNR ∞), "
        "`k failed` = victims whose run failed, never averaged in, and `k not scored` = runs "
        "with nothing to score (a batch without a sensitive sample). `≤ floor`: on the median "
        "victim the reconstruction is no closer than the floor, the public split's mean image "
        "scored against the same victim (each cell's median gain over it: "
        f"`{cells_name}`). `n/a`: metric unavailable; `no runs`: no metrics file for that "
        f"cell. Exact values: `{csv_name}`; figure: `{figure_name}` (error bars: the 95% "
        "intervals).",
        "",
    ]
    if "raw_recorded" in long.columns and bool((long["raw_recorded"] > 0).any()):
        lines += [
            "*raw gradient shared*: of the victims whose capture recorded it, how many shared "
            "their raw gradient G0 unprotected (CENSOR with `fallback: algorithm-1`: Algorithm "
            "1, lines 10-11 and 17-20, returns G0 when no orthogonal candidate lowers the loss); "
            "`—`: a defense that never shares it.",
            "",
        ]
    if scaled_down:
        lines += [
            f"> **SCALED-DOWN run of {reproduces}: these are not the paper's settings and "
            f"its numbers are not expected to match.** {scaled_down_note}",
            "",
        ]
    lines += _warnings(long)
    lines += _training_note(long)
    lines += _cell_tables(long, rows)
    lines += _floor_section(floor)
    lines += ["## Comparison with the paper", ""]
    if reference_name is None:
        lines.append(
            f"No published numbers: {no_reference}."
            if no_reference
            else "No published reference was given for this table."
        )
    elif comparison.empty:
        lines.append(
            f"No dataset of this run is one of the paper's datasets, so there is nothing "
            f"to compare against in `{reference_name}`; `{vs_paper_name}` holds only its "
            "header."
        )
    else:
        scales = ", ".join(sorted({str(s) for s in comparison["scale"]}))
        lines.append(
            f"{len(comparison)} cell(s) match `{reference_name}` (our scale: {scales}); "
            f"ours with its 95% interval, the paper's value, the difference and whether the "
            f"paper's value lies in our interval are in `{vs_paper_name}`"
            + _inside_count(comparison)
            + "."
        )
    lines.append("")
    lines += ["## Failed runs", ""]
    if failed_runs.empty:
        lines.append("None.")
    else:
        lines += [
            "| dataset | defense | attack | victim | failure | file |",
            "|---|---|---|---:|---|---|",
        ]
        for r in failed_runs.to_dict("records"):
            lines.append(
                f"| {_esc(r['dataset_label'])} | {_esc(r['defense_label'])} | "
                f"{_esc(r['attack_label'])} | {r['victim']} | "
                f"{_esc(r['failure'] or 'no reason given')} | `{_esc(r['source'])}` |"
            )
    lines += ["", "## Setting", ""]
    for key, value in setting.items():
        if isinstance(value, list | tuple):
            value = ", ".join(map(str, value))
        lines.append(f"- **{_esc(key)}**: {_esc(value)}")
    return "\n".join(lines).rstrip("\n") + "\n"
