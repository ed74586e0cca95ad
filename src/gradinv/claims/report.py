"""``results/claims.md``: the verdicts in one table, then every claim with its numbers."""

from __future__ import annotations

import pandas as pd

from gradinv.claims.verdicts import VERDICTS


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
