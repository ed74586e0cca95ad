"""A table's page for the browsable report (``snakemake --report``): the table's Markdown as
HTML (Python-Markdown renders it, tables included), its figure inline, and the published numbers
beside ours as a table of their own. One self-contained file: Snakemake's report shows an HTML
result in a frame, so the page carries its style and its image (a ``data:`` URI) with it.
"""

from __future__ import annotations

import base64
import html
import math
import os
from pathlib import Path

import markdown
import pandas as pd

from gradinv.io import atomic_path

STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; line-height: 1.45; margin: 1.5em;
       color: #1b1b1b; max-width: 110em; }
h1 { font-size: 1.35em; } h2 { font-size: 1.15em; } h3 { font-size: 1.05em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #c9c9c9; padding: 0.25em 0.55em; vertical-align: top; }
th { background: #eef1f5; text-align: left; }
td { font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
blockquote { border-left: 4px solid #d08c00; background: #fff8e6; margin: 1em 0;
             padding: 0.4em 1em; }
code { background: #f2f2f2; padding: 0 0.2em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 12px; color: #444; }
"""

# the comparison's columns as a reader names them, in the order they read best
_COMPARISON = {
    "dataset": "dataset",
    "defense": "defense",
    "attack": "attack",
    "metric": "metric",
    "ours": "ours: mean [95% interval] (n)",
    "paper": "paper",
    "difference": "ours − paper",
    "paper_in_interval": "paper in our interval",
}


def page(title: str, body_markdown: str, *, extra_html: str = "") -> str:
    """A whole HTML page: ``body_markdown`` rendered (tables, lists), then ``extra_html``."""
    body = markdown.markdown(body_markdown, extensions=["tables", "sane_lists"])
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n"
        f"<body>\n{body}\n{extra_html}\n</body></html>\n"
    )


def figure_html(png: str | os.PathLike[str], caption: str) -> str:
    """``png`` inline (a ``data:`` URI), with its caption; empty if there is no such file."""
    path = Path(png)
    if not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(caption, quote=True)}' "
        f"src='data:image/png;base64,{data}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def comparison_html(comparison: pd.DataFrame, reference_name: str | None) -> str:
    """Ours beside the paper's number, a line per (row, attack, metric) the paper prints."""
    if reference_name is None or comparison.empty:
        return ""
    rows = comparison.assign(
        ours=[_ours(r) for r in comparison.itertuples()],
        difference=comparison["difference"].map(_number),
        paper=comparison["paper"].map(_number),
        paper_in_interval=comparison["paper_in_interval"].map(_yes_no),
    )
    rows = rows[[c for c in _COMPARISON if c in rows.columns]].rename(columns=_COMPARISON)
    table = rows.to_html(index=False, border=0, na_rep="—", escape=True)
    return (
        f"<h2 id='vs-paper'>Ours beside the paper ({html.escape(reference_name)})</h2>\n"
        "<p>Each number the paper prints for this table, beside this run's mean and 95% "
        "interval (over the victims; for accuracy and PMM, over the training seeds), with n in "
        "parentheses. At a scaled-down setting the paper's numbers are not expected "
        "to match; the comparison says how far apart they are.</p>\n" + table
    )


def write_table_page(
    out: str | os.PathLike[str],
    *,
    title: str,
    markdown_text: str,
    figure: str | os.PathLike[str],
    figure_caption: str,
    comparison: pd.DataFrame,
    reference_name: str | None,
) -> Path:
    """Write ``out``: the table's Markdown, its figure and the comparison, atomically."""
    extra = figure_html(figure, figure_caption) + comparison_html(comparison, reference_name)
    with atomic_path(out) as tmp:
        tmp.write_text(page(title, markdown_text, extra_html=extra), encoding="utf-8")
    return Path(out)


def write_markdown_page(out: str | os.PathLike[str], *, title: str, markdown_text: str) -> Path:
    """Write ``out``: a Markdown document (the claims' verdicts) as a page, atomically."""
    with atomic_path(out) as tmp:
        tmp.write_text(page(title, markdown_text), encoding="utf-8")
    return Path(out)


def _number(value: object) -> str:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "—"
    if pd.isna(number):
        return "—"
    return "∞" if number == math.inf else f"{number:.4g}"


def _yes_no(value: object) -> str:
    if isinstance(value, str):
        value = {"true": True, "false": False}.get(value.strip().lower(), value)
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return "—"


def _ours(row: object) -> str:
    mean = _number(getattr(row, "ours_mean", None))
    low = _number(getattr(row, "ours_ci_low", None))
    high = _number(getattr(row, "ours_ci_high", None))
    n = getattr(row, "ours_n", None)
    interval = f" [{low}, {high}]" if low != "—" and high != "—" else ""
    count = f" ({int(n)})" if isinstance(n, int | float) and not pd.isna(n) else ""
    return f"{mean}{interval}{count}"
