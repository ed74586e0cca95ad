"""Stage: CENSOR's convergence study (its Figs. 7-8 and Table VI) from the training summaries.

Each input is the summary of one FL training run (``gradinv train``) on the study's non-IID
partition. Figures 7 and 8 plot test accuracy and test loss per round, one curve per defense;
Table VI gives the final test accuracy for each number of selected clients, CENSOR beside vanilla
training. A failed (diverged) run keeps its row with an empty accuracy and its reason.

The runs of the official code's loop (:mod:`gradinv.fl.official`, central training with one
defended step per epoch) are a second panel of both figures and a second table in
``table6_clients.md``, so the FL result and the code's result stand side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from gradinv.io import atomic_path, read_json
from gradinv.stages.common import project_path
from gradinv.stages.summary import defense_rates, final_accuracy
from gradinv.tables.figures import curve_figure, figure_caption
from gradinv.tables.html import write_markdown_page
from gradinv.tables.render import write_csv

CURVE_COLUMNS = (
    "loop",
    "defense",
    "label",
    "clients_per_round",
    "round",
    "test_accuracy",
    "test_loss",
)
FL_LOOP = "FL, CENSOR's Algorithm 1"
OFFICIAL_LOOP = "official code's loop (central training)"
X_LABELS = {FL_LOOP: "FL round", OFFICIAL_LOOP: "epoch (one defended step + central epoch)"}


def run(
    settings: dict[str, Any],
    curves: list[Path],
    clients: list[Path],
    out_dir: Path,
    official: list[Path] = (),
) -> None:
    conv, labels, scale = settings["convergence"], settings["labels"], settings["scale"]
    # results/convergence/<dataset>/<model>/<defense>/k<K>/summary.json: K is in the path.
    runs = {
        path: {**read_json(path), "clients_per_round": int(path.parent.name.removeprefix("k"))}
        for path in dict.fromkeys([*curves, *clients])
    }
    loop_runs = [{**read_json(p), "clients_per_round": None} for p in official]
    frame = pd.concat(
        [
            _curves([runs[p] for p in curves], labels, FL_LOOP),
            _curves(loop_runs, labels, OFFICIAL_LOOP),
        ],
        ignore_index=True,
    )
    write_csv(frame.assign(scale=scale), out_dir / "convergence.csv")
    plotted = frame.rename(columns={"loop": "panel"}) if loop_runs else frame.drop(columns="loop")
    title = f"{conv['title'].split(':')[0]}"
    for name, y, y_label, fig in (
        ("fig7_accuracy.png", "test_accuracy", "test accuracy", 7),
        ("fig8_loss.png", "test_loss", "test loss", 8),
    ):
        curve_figure(
            plotted,
            out_dir / name,
            y=y,
            y_label=y_label,
            caption=figure_caption(f"{title}, Fig. {fig}: {y_label}", scale, "table6_clients.md"),
            x_labels=X_LABELS,
        )
    table = _clients_table([runs[p] for p in clients], conv, labels)
    write_csv(table, out_dir / "table6_clients.csv")
    comparison = _vs_paper(table, project_path(conv["reference"]), conv, labels, scale)
    write_csv(comparison, out_dir / "table6_clients_vs_paper.csv")
    text = _markdown(table, comparison, [runs[p] for p in runs], settings)
    text += _official_markdown(loop_runs, conv, labels)
    with atomic_path(out_dir / "table6_clients.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    write_markdown_page(out_dir / "table6_clients.html", title=title, markdown_text=text)


def _k(summary: dict[str, Any]) -> int:
    return int(summary["clients_per_round"])


def _curves(summaries: list[dict[str, Any]], labels: dict[str, str], loop: str) -> pd.DataFrame:
    rows = []
    for s in summaries:
        for point in s["history"]:
            if "test_accuracy" in point:
                rows.append(
                    {
                        "loop": loop,
                        "defense": s["defense"],
                        "label": labels[s["defense"]],
                        "clients_per_round": s["clients_per_round"],
                        "round": int(point["round"]),
                        "test_accuracy": float(point["test_accuracy"]),
                        "test_loss": float(point["test_loss"]),
                    }
                )
    return pd.DataFrame.from_records(rows, columns=list(CURVE_COLUMNS))


def _final(summary: dict[str, Any]) -> tuple[float | None, int | None]:
    """Test accuracy (%) at the last evaluated round of a finished run; None if it failed."""
    return final_accuracy(summary, last=1)


def _clients_table(
    summaries: list[dict[str, Any]], conv: dict[str, Any], labels: dict[str, str]
) -> pd.DataFrame:
    """One line per number of selected clients: final accuracy per defense, their difference."""
    by_key = {(s["defense"], _k(s)): s for s in summaries}
    first, *rest = conv["clients_defenses"]
    records = []
    for k in conv["clients_per_round"]:
        line: dict[str, Any] = {"selected_clients": k}
        for d in conv["clients_defenses"]:
            s = by_key[(d, k)]
            accuracy, at_round = _final(s)
            line[f"{labels[d]} accuracy"] = accuracy
            line[f"{labels[d]} round"] = at_round
            raw = defense_rates(s)["raw_gradient_rate"]
            if raw is not None:  # CENSOR: the share of updates that were the raw gradient
                line[f"{labels[d]} raw gradient rate"] = raw
            line[f"{labels[d]} failure"] = s["failure"] or ""
        for d in rest:
            a, b = line[f"{labels[d]} accuracy"], line[f"{labels[first]} accuracy"]
            line[f"{labels[d]} - {labels[first]}"] = None if a is None or b is None else a - b
        records.append(line)
    return pd.DataFrame.from_records(records)


def _vs_paper(
    table: pd.DataFrame,
    reference: Path,
    conv: dict[str, Any],
    labels: dict[str, str],
    scale: str,
) -> pd.DataFrame:
    """Table VI reports CENSOR's accuracy only; compared where the run is at the paper's scale."""
    ref = pd.read_csv(reference)
    columns = ["selected_clients", "ours", "paper", "difference", "scale"]
    censor = [d for d in conv["clients_defenses"] if d != "none"]
    if scale != "paper" or not censor:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    ours = table[["selected_clients", f"{labels[censor[0]]} accuracy"]].set_axis(
        ["selected_clients", "ours"], axis=1
    )
    merged = ours.merge(ref.rename(columns={"accuracy": "paper"}), on="selected_clients")
    merged["difference"] = merged["ours"] - merged["paper"]
    merged["scale"] = scale
    return merged[columns]


def _markdown(
    table: pd.DataFrame,
    comparison: pd.DataFrame,
    summaries: list[dict[str, Any]],
    settings: dict[str, Any],
) -> str:
    conv = settings["convergence"]
    lines = [f"# {conv['title']}", ""]
    if settings["scale"] == "embedded":
        lines += [f"> **SCALED-DOWN run.** {conv['scaled_down_note'].strip()}", ""]
    lines += [
        "Final test accuracy (%) at the last evaluated round, for each number of clients "
        "selected per round (Table VI). Curves per round: `convergence.csv`, "
        "`fig7_accuracy.png`, `fig8_loss.png`.",
        "",
        "| " + " | ".join(table.columns) + " |",
        "|" + "---|" * len(table.columns),
    ]
    for rec in table.to_dict("records"):
        lines.append("| " + " | ".join(_text(k, v) for k, v in rec.items()) + " |")
    lines += ["", "## Setting", ""]
    lines += [f"- partition: {conv['partition']}", f"- FL: {settings['fl']}"]
    lines += [f"- seed: {settings['seed']}, scale: {settings['scale']}"]
    commits = sorted({str(s.get("git_commit")) for s in summaries})
    lines += [f"- git commit(s): {', '.join(commits)}", ""]
    lines += _rates_markdown(summaries, settings["labels"])
    lines += ["## Published numbers (Table VI, CENSOR accuracy %)", ""]
    if comparison.empty:
        lines += [
            "Not compared: only a run at the paper's scale (CIFAR-10, 100 clients) is "
            "comparable; `table6_clients_vs_paper.csv` is header-only.",
        ]
    else:
        lines += ["| selected clients | ours | paper | difference |", "|---|---|---|---|"]
        for rec in comparison.to_dict("records"):
            lines.append(
                f"| {rec['selected_clients']} | {rec['ours']:.2f} | {rec['paper']:.2f} | "
                f"{rec['difference']:+.2f} |"
            )
    return "\n".join(lines) + "\n"


def _text(column: str, value: Any) -> str:
    """A Table VI cell: empty for a missing value (a failed run), rounds and counts whole."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    if column.endswith(("round", "clients")):
        return str(int(value))
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _rates_markdown(summaries: list[dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """Each CENSOR run's share of client updates that were the raw gradient (Algorithm 1's
    fallback: those rounds leak) and in which no candidate beat the undefended loss."""
    rows = []
    for s in sorted(summaries, key=lambda s: (_k(s), s["defense"])):
        rates = defense_rates(s)
        if rates["fallback_rate"] is None:
            continue
        accuracy, _ = _final(s)
        rows.append(
            f"| {labels[s['defense']]} | {_k(s)} | {rates['raw_gradient_rate']:.3f} | "
            f"{rates['fallback_rate']:.3f} | {(s.get('defense_stats') or {}).get('updates')} | "
            f"{'' if accuracy is None else f'{accuracy:.2f}'} |"
        )
    if not rows:
        return []
    return [
        "## How often CENSOR shared the raw gradient",
        "",
        "Over each FL run: *raw G0*, the share of client updates that were the raw gradient, "
        "unprotected (Algorithm 1, lines 10-11: no orthogonal candidate lowered the loss); "
        "*fallback*, the share in which no candidate did (with `fallback: never-raw` the best "
        "candidate is shared anyway). Per round: each run's `summary.json` history and MLflow "
        "(`raw_gradient_rate`, `fallback_rate`).",
        "",
        "| defense | clients per round | raw G0 | fallback | updates | accuracy (%) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _official_markdown(
    summaries: list[dict[str, Any]], conv: dict[str, Any], labels: dict[str, str]
) -> str:
    """The official code's loop: final accuracy per defense and its difference to vanilla."""
    if not summaries:
        return ""
    loop = conv["official_loop"]
    lines = [
        "",
        "## The official code's loop (central training; not FL)",
        "",
        f"CENSOR's official code (`run_rec.py`) trains centrally on raw gradients every epoch "
        f"and takes one defended step per epoch; the defense is on in the first "
        f"{loop['defended_epochs']} of {loop['epochs']} epochs here. Final test accuracy (%):",
        "",
        "| defense | accuracy | epoch | difference to no defense | raw G0 in defended steps "
        "| failure |",
        "|---|---|---|---|---|---|",
    ]
    finals = {s["defense"]: _final(s) for s in summaries}
    vanilla = finals.get("none", (None, None))[0]
    for s in summaries:
        accuracy, epoch = finals[s["defense"]]
        diff = "" if accuracy is None or vanilla is None else f"{accuracy - vanilla:+.2f}"
        shown = "" if accuracy is None else f"{accuracy:.2f}"
        stats = s.get("defense_stats") or {}
        raw = defense_rates(s)["raw_gradient_rate"]
        raw_text = "" if raw is None else f"{stats.get('raw_shared', 0)} of {stats['updates']}"
        lines.append(
            f"| {labels[s['defense']]} | {shown} | {epoch or ''} | {diff} | {raw_text} | "
            f"{s['failure'] or ''} |"
        )
    return "\n".join(lines) + "\n"
