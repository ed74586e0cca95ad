"""Figures of a table: bar charts of the cells, lines over a sweep, utility against privacy
(Refiner's Figs. 6, 9, 10) and curves; the grid of reconstructions is in ``grid.py``.

Every figure carries a caption under it, also stored as the PNG's ``Title``: what it reproduces
and at what scale, so that a scaled-down figure seen on its own is never taken for the paper's.
Figures are drawn on a bare ``matplotlib.figure.Figure`` with the Agg canvas, never through
pyplot's global state, and saved without the PNG "Software" stamp, so the same cells give the
same bytes on the same library versions. Both files are written atomically (temporary file in
the same folder, then ``os.replace``) so a killed job never leaves a truncated PNG behind.
"""

from __future__ import annotations

import itertools
import math
import os
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from gradinv.io import atomic_path
from gradinv.tables.aggregate import TableError, metric_axis_label, metric_header

DPI = 100
PNG_METADATA: dict[str, Any] = {"Software": None}


def figure_caption(title: str, scale: str, details: str) -> str:
    """The line under a figure: what it shows and at what scale; a scaled-down run says so and
    names the file that says what was scaled down (``details``)."""
    if scale == "embedded":
        return f"{title}. SCALED-DOWN run (embedded scale), not the paper's setting: see {details}."
    return f"{title}. Scale: {scale}."


def save_figure(fig: Figure, out_path: str | os.PathLike[str], caption: str) -> None:
    """Write ``fig`` as a PNG with ``caption`` under it and as its ``Title``, atomically.

    The caption goes below everything already drawn (rotated tick labels, axis labels), so it
    never covers them. Text boxes that overlap are reported (:func:`text_overlaps`): a warning,
    or an error with ``GRADINV_FIGURE_CHECK=strict`` (what the tests set).
    """
    canvas = FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    drawn = fig.get_tightbbox(renderer)  # inches
    height, width = fig.get_figheight(), max(fig.get_figwidth(), drawn.width)
    # about 14 characters of 7-point text to the inch; at least 60 to a line on a narrow figure
    lines = textwrap.fill(caption, width=max(60, int(14 * width)))
    fig.text(
        (drawn.x0 + drawn.x1) / 2 / fig.get_figwidth(),
        (drawn.y0 - 0.08) / height,
        lines,
        ha="center",
        va="top",
        fontsize=7,
    )
    _check_overlaps(fig, out_path)
    with atomic_path(out_path) as tmp:
        fig.savefig(
            tmp,
            format="png",
            dpi=DPI,
            metadata={**PNG_METADATA, "Title": caption},
            bbox_inches="tight",  # takes in the caption, drawn below the axes
            pad_inches=0.1,
        )


def text_overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts of ``fig`` whose boxes overlap as drawn (by more than
    a pixel each way): titles, tick and axis labels, legends, notes, the caption."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes, hidden = [], _undrawn_axis_texts(fig)
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in hidden:
            continue
        box = text.get_window_extent(renderer)
        if box.width > 0 and box.height > 0:
            boxes.append((text.get_text(), box.expanded(1, 1).padded(-1)))
    return [
        (a, b)
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
        if box_a.overlaps(box_b)
    ]


def _undrawn_axis_texts(fig: Figure) -> set[int]:
    """The ids of the axis texts matplotlib keeps but does not draw: every label of an axes
    turned off (``ax.axis("off")``), and tick labels outside their axis's view (they do not know
    their axes, so they are found from the axes)."""
    hidden = set()
    for ax in fig.axes:
        if not ax.axison:
            hidden |= {id(t) for axis in (ax.xaxis, ax.yaxis) for t in axis.findobj(Text)}
            continue
        for index, (axis, limits) in enumerate(
            ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim()))
        ):
            low, high = sorted(limits)
            slack = 1e-9 * (high - low)
            for tick in (*axis.majorTicks, *axis.minorTicks):
                for label in (tick.label1, tick.label2):
                    if not low - slack <= label.get_position()[index] <= high + slack:
                        hidden.add(id(label))
    return hidden


def _check_overlaps(fig: Figure, out_path: str | os.PathLike[str]) -> None:
    found = text_overlaps(fig)
    if not found:
        return
    pairs = "; ".join(f"{a!r} and {b!r}" for a, b in found[:5])
    message = f"{out_path}: {len(found)} pair(s) of overlapping text: {pairs}"
    if os.environ.get("GRADINV_FIGURE_CHECK", "").strip().lower() == "strict":
        raise TableError(message)
    warnings.warn(message, stacklevel=3)


def _say_why_empty(ax: Any, panel: pd.DataFrame) -> bool:
    """Write the cells' note on a panel without any value; True if it had none.

    The panel says what is missing in a few words (``LPIPS unavailable``); the whole reason, with
    its fix, is in the table's Markdown."""
    if (~np.isnan(panel["mean"].to_numpy(dtype=float))).any():
        return False
    notes = [n for n in panel["note"] if n]
    note = notes[0].split(":")[0].strip() if notes else "no values"
    ax.text(
        0.5,
        0.5,
        textwrap.fill(f"{note}\n(see the table's notes)" if notes else note, width=28),
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=8,
        color="dimgray",
    )
    ax.set_yticks([])
    return True


def table_figure(
    long: pd.DataFrame,
    out_path: str | os.PathLike[str],
    *,
    rows: Sequence[str] = ("dataset", "defense"),
    caption: str,
) -> None:
    """One panel per (facet, metric): bars = last row column (defense), hue = attack.

    The bar height is the cell mean and the error bar its 95% interval over victims (the
    bootstrap of :mod:`gradinv.stats`; none for a single victim), taken from the same long table
    as the CSV so figure and table cannot disagree. A panel whose metric is unavailable
    says so instead of being blank.
    """
    x_col, facet_cols = rows[-1], list(rows[:-1])
    metrics = list(dict.fromkeys(long["metric"]))
    attacks = list(dict.fromkeys(long["attack_label"]))
    facet_key = (
        long[[f"{c}_label" for c in facet_cols]].astype(str).agg(" / ".join, axis=1)
        if facet_cols
        else pd.Series("", index=long.index)
    )
    facets = list(dict.fromkeys(facet_key))
    xs = list(dict.fromkeys(long[f"{x_col}_label"]))
    colors = sns.color_palette("colorblind", len(attacks))
    width = 0.8 / max(len(attacks), 1)
    panel_width, per_row = _bar_panels(
        len(xs), len(attacks), len(metrics), noted=bool(long["failed"].gt(0).any())
    )
    metric_rows = math.ceil(len(metrics) / per_row)
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(panel_width * per_row, 3.6 * len(facets) * metric_rows + 0.8))
        axes = fig.subplots(len(facets) * metric_rows, per_row, squeeze=False)
        for i, j in itertools.product(
            range(len(facets)), range(len(metrics), per_row * metric_rows)
        ):
            fig.delaxes(axes[i * metric_rows + j // per_row][j % per_row])  # a row's empty end
        for (i, facet), (j, metric) in itertools.product(enumerate(facets), enumerate(metrics)):
            ax = axes[i * metric_rows + j // per_row][j % per_row]
            panel = long[(facet_key == facet) & (long["metric"] == metric)]
            title = f"{facet} — {metric_header(metric)}" if facet else metric_header(metric)
            ax.set_title(title)
            for k, attack in enumerate(attacks):
                part = panel[panel["attack_label"] == attack].set_index(f"{x_col}_label")
                means = np.array([part["mean"].get(x, math.nan) for x in xs], dtype=float)
                lows = np.array([part["ci_low"].get(x, math.nan) for x in xs], dtype=float)
                highs = np.array([part["ci_high"].get(x, math.nan) for x in xs], dtype=float)
                pos = np.arange(len(xs)) - 0.4 + width * (k + 0.5)
                exact = np.isposinf(means)  # PSNR of exact reconstructions: no bar, a sign
                ax.bar(
                    pos,
                    np.where(np.isfinite(means), means, 0.0),
                    width,
                    color=colors[k],
                    label=attack,
                )
                for p in pos[exact]:
                    ax.text(
                        p,
                        0.97,
                        "∞",
                        ha="center",
                        va="top",
                        fontsize=8,
                        transform=ax.get_xaxis_transform(),
                    )
                ok = np.isfinite(means) & np.isfinite(lows) & np.isfinite(highs)
                ax.errorbar(
                    pos[ok],
                    means[ok],
                    yerr=np.vstack([means[ok] - lows[ok], highs[ok] - means[ok]]),
                    fmt="none",
                    ecolor="black",
                    elinewidth=0.8,
                    capsize=2,
                )
                for p, x in zip(pos, xs, strict=True):  # failures are shown, never hidden
                    failed = int(part["failed"].get(x, 0))
                    if failed:
                        ax.text(
                            p,
                            0.03,
                            f"{failed} failed",
                            rotation=90,
                            ha="center",
                            va="bottom",
                            fontsize=6,
                            color="firebrick",
                            transform=ax.get_xaxis_transform(),
                        )
            if not _say_why_empty(ax, panel):
                ax.set_ylabel(metric_axis_label(metric), fontsize=8)
            ax.set_xticks(np.arange(len(xs)), xs, rotation=90)  # upright: boxes never overlap
            if i == len(facets) - 1 and j // per_row == metric_rows - 1:
                ax.set_xlabel(x_col)
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(attacks), frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
        save_figure(fig, out_path, caption)


# A bar chart's panels: at least PANEL_INCHES wide, and as wide as their bars need: a tick
# label's height (TICK_INCHES) per x value, and where a bar's "n failed" note is drawn, the
# note's height (NOTE_INCHES) per bar, beside a y axis (AXIS_INCHES); as many panels a row as
# fit in FIGURE_INCHES (a wide sweep: one a row).
PANEL_INCHES, FIGURE_INCHES, AXIS_INCHES, TICK_INCHES, NOTE_INCHES = 3.2, 16.0, 0.9, 0.14, 0.11


def _bar_panels(xs: int, hues: int, panels: int, *, noted: bool) -> tuple[float, int]:
    """The width of each panel of a bar chart (inches) and how many panels a row holds;
    ``noted``: some bar carries an "n failed" note."""
    bars = xs * max(hues, 1)
    needed = max(TICK_INCHES * xs, NOTE_INCHES * bars if noted else 0.0) + AXIS_INCHES
    width = max(PANEL_INCHES, needed)
    return width, max(1, min(panels, int(FIGURE_INCHES // width)))


def sweep_figure(
    long: pd.DataFrame,
    out_path: str | os.PathLike[str],
    *,
    x: Mapping[Any, float],
    x_column: str,
    x_label: str,
    caption: str,
    series: Mapping[Any, str] | None = None,
) -> None:
    """One panel per metric; x = a swept setting (round, T, ...), one line per other row and
    attack, with the 95% interval over victims as a band (CENSOR Fig. 9, Table V as a curve).

    ``x`` maps each value of ``long[x_column]`` to its position (a defense to its T, a round to
    itself); ``series`` maps each value of ``long[x_column]`` to its family where several run
    along one axis (CENSOR's T under each fallback), a line each. Failed runs are counted in the
    legend rather than hidden.
    """
    metrics = list(dict.fromkeys(long["metric"]))
    frame = long.assign(x=long[x_column].map(x).astype(float))
    others = [c for c in ("dataset", "defense") if c != x_column and c in long.columns]
    parts = frame[[f"{c}_label" for c in others] + ["attack_label"]].astype(str)
    if series:
        parts = parts.assign(series=frame[x_column].map(series).astype(str))
    frame["line"] = parts.agg(" / ".join, axis=1)
    lines = list(dict.fromkeys(frame["line"]))
    colors = sns.color_palette("colorblind", len(lines))
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(3.2 * len(metrics), 3.0))
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        for ax, metric in zip(axes, metrics, strict=True):
            ax.set_title(metric_header(metric))
            ax.set_xlabel(x_label)
            panel = frame[frame["metric"] == metric]
            for color, line in zip(colors, lines, strict=True):
                part = panel[panel["line"] == line].sort_values("x")
                xs, mean = part["x"].to_numpy(), part["mean"].to_numpy(dtype=float)
                low = part["ci_low"].to_numpy(dtype=float)
                high = part["ci_high"].to_numpy(dtype=float)
                failed = int(part["failed"].sum())
                label = f"{line} ({failed} failed)" if failed else line
                ax.plot(xs, mean, marker="o", color=color, label=label)
                band = np.isfinite(low) & np.isfinite(high)  # none for a single victim
                ax.fill_between(
                    xs,
                    np.where(band, low, mean),
                    np.where(band, high, mean),
                    color=color,
                    alpha=0.2,
                    lw=0,
                )
            if not _say_why_empty(ax, panel):
                ax.set_ylabel(metric_axis_label(metric), fontsize=8)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=min(len(lines), 4), frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
        save_figure(fig, out_path, caption)


def tradeoff_points(
    long: pd.DataFrame,
    *,
    x_metric: str,
    lines: Mapping[str, tuple[str, int]],
    facets: Sequence[str] = ("dataset",),
) -> pd.DataFrame:
    """The points of a utility-privacy figure: one per (facet, metric, attack, defense), with
    the defense's ``x_metric`` (PMM: one value per defense, the same in every attack's column) as
    ``x`` and the cell's mean as ``y``; ``lines`` maps each defense to its line (its base
    defense's label, for a sweep point) and its place along it (the sweep's order)."""
    unknown = sorted(set(long["defense"]) - set(lines))
    if unknown:
        raise TableError(f"no line of the utility-privacy figure for defense(s) {unknown}.")
    keys = [*facets, "defense"]
    x = (
        long[long["metric"] == x_metric]
        .dropna(subset=["mean"])
        .groupby(keys, sort=False)[["mean", "ci_low", "ci_high"]]
        .first()
        .rename(columns={"mean": "x", "ci_low": "x_low", "ci_high": "x_high"})
    )
    points = long[long["metric"] != x_metric].join(x, on=keys)
    points["line"] = points["defense"].map(lambda d: lines[d][0])
    points["order"] = points["defense"].map(lambda d: lines[d][1])
    points["facet"] = (
        points[[f"{c}_label" for c in facets]].astype(str).agg(" / ".join, axis=1) if facets else ""
    )
    points = points.rename(columns={"mean": "y", "ci_low": "y_low", "ci_high": "y_high"})
    return points.sort_values("order", kind="stable")


def tradeoff_figure(
    long: pd.DataFrame,
    out_path: str | os.PathLike[str],
    *,
    x_metric: str,
    lines: Mapping[str, tuple[str, int]],
    facets: Sequence[str] = ("dataset",),
    caption: str,
) -> None:
    """Utility against privacy, as Refiner's Figs. 6, 9 and 10 draw it: a panel per facet
    (dataset, model) and per (metric, attack); ``x_metric`` on x, the metric on y, one line per
    defense through the points of its sweep (a defense without a sweep, no defense, is a point).
    """
    points = tradeoff_points(long, x_metric=x_metric, lines=lines, facets=facets)
    draw_tradeoff(points, out_path, x_label=metric_header(x_metric), caption=caption)


def draw_tradeoff(
    points: pd.DataFrame, out_path: str | os.PathLike[str], *, x_label: str, caption: str
) -> None:
    """Draw utility-privacy ``points`` (columns ``facet``, ``metric``, ``attack_label``,
    ``line``, ``x``, ``y`` and ``note``, what a panel without a point says): a panel per facet
    and (metric, attack), each line through its points in the frame's order; ``x_low``,
    ``x_high``, ``y_low`` and ``y_high``, where given, are the 95% intervals, drawn as error bars
    in both directions (none where a bound is missing or infinite)."""
    rows = list(dict.fromkeys(points["facet"]))
    columns = list(dict.fromkeys(zip(points["metric"], points["attack_label"], strict=True)))
    names = list(dict.fromkeys(points["line"]))
    palette = sns.color_palette("tab10" if len(names) <= 10 else "tab20", len(names))
    colors = dict(zip(names, palette, strict=True))
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(3.4 * len(columns), 2.9 * len(rows) + 0.9))
        axes = fig.subplots(len(rows), len(columns), squeeze=False)
        for (i, facet), (j, (metric, attack)) in itertools.product(
            enumerate(rows), enumerate(columns)
        ):
            ax = axes[i][j]
            panel = points[
                (points["facet"] == facet)
                & (points["metric"] == metric)
                & (points["attack_label"] == attack)
            ]
            title = f"{attack}: {metric_header(metric)}"
            ax.set_title(f"{facet} — {title}" if facet else title)
            ax.set_xlabel(x_label)
            # a point needs both values: a failed utility run leaves its defense without x
            drawn = panel.dropna(subset=["x", "y"])
            if drawn.empty and panel["y"].notna().any():
                panel = panel.assign(note=f"no {x_label} for any point: see the table's notes")
            if _say_why_empty(ax, panel.assign(mean=drawn["y"])):
                continue
            ax.set_ylabel(metric_axis_label(metric), fontsize=8)
            for name, line in drawn.groupby("line", sort=False):
                ax.plot(line["x"], line["y"], marker="o", color=colors[name], label=name)
                ax.errorbar(
                    line["x"],
                    line["y"],
                    xerr=_error_bars(line, "x"),
                    yerr=_error_bars(line, "y"),
                    fmt="none",
                    ecolor=colors[name],
                    elinewidth=0.8,
                    capsize=2,
                )
        legend = {}
        for ax in axes.flat:  # every line, whichever panels it has points in
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                legend.setdefault(label, handle)
        if legend:  # none when no panel has a point (every utility run failed)
            fig.legend(
                list(legend.values()),
                list(legend),
                loc="upper center",
                ncol=min(len(legend), 4),
                frameon=False,
            )
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))
        save_figure(fig, out_path, caption)


def _error_bars(points: pd.DataFrame, axis: str) -> np.ndarray | None:
    """Matplotlib's error distances (below, above) of ``points[axis]`` from its ``<axis>_low``
    and ``<axis>_high`` interval; 0 where a bound is missing or infinite (one victim or seed, an
    exact reconstruction); None without the columns."""
    if f"{axis}_low" not in points or f"{axis}_high" not in points:
        return None
    value = points[axis].to_numpy(dtype=float)
    low = points[f"{axis}_low"].to_numpy(dtype=float)
    high = points[f"{axis}_high"].to_numpy(dtype=float)
    shown = np.isfinite(low) & np.isfinite(high) & np.isfinite(value)
    below = np.where(shown, value - low, 0.0)
    above = np.where(shown, high - value, 0.0)
    return np.vstack([np.maximum(below, 0.0), np.maximum(above, 0.0)])


def curve_figure(
    curves: pd.DataFrame,
    out_path: str | os.PathLike[str],
    *,
    y: str,
    y_label: str,
    caption: str,
    x_labels: Mapping[str, str] | None = None,
) -> None:
    """``y`` against ``round``, one line per ``label`` (CENSOR Figs. 7 and 8).

    With a ``panel`` column, one panel per value side by side (sharing the y axis), its x axis
    named by ``x_labels[panel]``; without one, a single panel over "FL round".
    """
    panels = list(dict.fromkeys(curves["panel"])) if "panel" in curves else [None]
    labels = list(dict.fromkeys(curves["label"]))
    colors = dict(zip(labels, sns.color_palette("colorblind", len(labels)), strict=True))
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(5.0 * len(panels), 3.4))
        axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
        for ax, panel in zip(axes, panels, strict=True):
            part = curves if panel is None else curves[curves["panel"] == panel]
            for label in dict.fromkeys(part["label"]):
                line = part[(part["label"] == label) & part[y].notna()].sort_values("round")
                ax.plot(line["round"], line[y], color=colors[label], label=label)
            ax.set_xlabel((x_labels or {}).get(panel, "FL round"))
            if panel is not None:
                ax.set_title(panel, fontsize=8)
            ax.legend(frameon=False, fontsize=7)
        axes[0].set_ylabel(y_label)
        fig.tight_layout()
        save_figure(fig, out_path, caption)
