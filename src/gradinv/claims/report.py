"""``results/claims.md``: the verdicts in one table, then every claim with its numbers."""

from __future__ import annotations

import pandas as pd

from gradinv.claims.paired import PSNR_CEILING
from gradinv.claims.verdicts import VERDICTS
from gradinv.stats import EXACT_MAX, POWER, RESAMPLES, SIGN_FLIP_MIN


def markdown(table: pd.DataFrame, scale: str) -> str:
    """``results/claims.md``: the verdicts first, then every claim with its numbers."""
    counts = table["verdict"].value_counts()
    decided = counts.get("holds", 0) + counts.get("fails", 0)
    partial = int(((table["verdict"] == "holds") & (table["undecidable_groups"] > 0)).sum())
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
        "**" + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS) + f"** of {len(table)} "
        f"claims: {decided} decided (holds or fails)"
        + (
            f"; {partial} of those that hold hold on their decidable groups only (the others' "
            "attack does not beat the floor without a defense: the note names them)"
            if partial
            else ""
        )
        + ". Each inconclusive or undecidable claim says what would decide it.",
        "",
        "How a verdict is reached. In each group of the check (dataset, attack, metric, ...) the "
        "two sides are paired on the same victims (a defense against another on the same "
        "images, two attacks, two rounds) or, for accuracy, on the same training seeds, and the "
        "mean paired difference comes with its 95% interval: over victims the exact sign-flip "
        f"(permutation) interval, which needs {SIGN_FLIP_MIN} victims before it can exclude "
        f"anything (all sign patterns up to {EXACT_MAX} victims, {RESAMPLES:,} seeded random "
        "ones beyond); over seeds the paired t-interval. A group **holds** when its interval "
        "lies on the claimed side (beyond the claim's tolerance), **fails** when it lies on the "
        "other side, and is "
        "**inconclusive** otherwise; it is **undecidable** when the attack does not beat the "
        "floor without a defense (the public split's mean image, on the median undefended "
        "victim): that attack recovered nothing a defense could lower. The claim combines its "
        "decidable groups: `all` holds if every group holds and fails if any fails; a fraction "
        "f holds if ⌈f·k⌉ of the k groups hold and fails once that is out of reach; "
        "`only_where` holds if the named groups hold and the others fail. A PSNR is paired as at "
        f"most {PSNR_CEILING:g} dB, an exact reconstruction's +∞ too (closer than the victim's "
        "own 8-bit rounding: no image file tells them apart). `on the paper's numbers`: "
        "the same relation on the published cell means, where there is a published table (it "
        "tests how the claim is encoded). *What would decide it*: for an inconclusive claim, the "
        "victims (or seeds) a group in all at which, if each group's mean and spread stayed "
        f"as observed, the groups needing at most that many are decided ({POWER:.0%} power "
        "each, the paired t-test's sample size: a planning figure, not a promise) and with "
        "them the claim; for an undecidable one, an attack budget at which the undefended "
        "attack beats the floor.",
        "",
        "| claim | paper | source | verdict | groups: holds / fails / inconclusive / "
        "undecidable | on the paper's numbers |",
        "|---|---|---|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        groups = (
            f"{r.holds_groups} / {r.fails_groups} / {r.inconclusive_groups} / "
            f"{r.undecidable_groups}"
        )
        lines.append(
            f"| `{r.id}` | {r.paper} | {r.source} | **{r.verdict}** | {groups} | "
            f"{r.paper_verdict or '-'} |"
        )
    lines.append("")
    for r in table.itertuples(index=False):
        lines += [f"## `{r.id}`: {r.verdict}", "", f"> {r.claim}", ""]
        lines.append(f"{r.paper}, {r.source}; checked on `{r.table}`: {r.combine}.")
        if r.reason:
            lines += ["", f"Note: {r.reason}."]
        if r.to_decide:
            lines += ["", f"What would decide it: {r.to_decide}."]
        if r.evidence:
            lines += ["", *(f"- {part}" for part in str(r.evidence).split("; "))]
        lines.append("")
    return "\n".join(lines)
