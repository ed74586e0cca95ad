"""A grid of reconstructions (CENSOR Fig. 6): a row per defense, the private images in the
first column, then a column per attack, the same victims side by side in every cell. Saved
with its caption by :func:`gradinv.tables.figures.save_figure`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gradinv.tables.aggregate import TableError
from gradinv.tables.figures import DPI, save_figure

MISSING, FAILED = "missing", "failed"  # what a tile without an image says
NOT_KEPT = "not on\ndisk"  # its attack's file was deleted or not carried to this machine


@dataclass(frozen=True)
class GridEntry:
    """One reconstruction: which run it came from, the private image and the attacker's image."""

    dataset: str
    defense_label: str
    attack_label: str
    victim: int
    original: Any  # float tensor or array (C, H, W) in [0, 1]
    # the same; None where the attack failed (no image to show), or a label drawn in its place
    # (NOT_KEPT: the attack ran, but its file is not here)
    reconstruction: Any


def _as_entry(entry: GridEntry | Mapping[str, Any]) -> GridEntry:
    if isinstance(entry, GridEntry):
        return entry
    return GridEntry(**{k: entry[k] for k in GridEntry.__dataclass_fields__})


def _image(value: Any, what: str) -> np.ndarray | None:
    """(C, H, W) tensor/array -> (H, W, C) array for imshow; ``None`` if it is not finite."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != 3 or arr.shape[0] not in (1, 3):
        raise TableError(f"{what}: expected an image of shape (C, H, W), C in 1/3; got {arr.shape}")
    if not np.isfinite(arr).all():
        return None
    arr = np.clip(arr, 0.0, 1.0).transpose(1, 2, 0)
    return arr[..., 0] if arr.shape[2] == 1 else arr


def reconstruction_grid(
    entries: Sequence[GridEntry | Mapping[str, Any]],
    out_path: str | os.PathLike[str],
    caption: str,
    *,
    victims: int = 4,
) -> None:
    """Rows: defenses; columns: the originals, then each attack; in every cell the first
    ``victims`` victims side by side, drawn pixel for pixel (nearest neighbour, no smoothing).

    Rows, attacks and victims follow their order of first appearance in ``entries``, so the
    caller decides the layout. Two different originals for the same (dataset, victim) are an
    error: the grid would otherwise compare a reconstruction against the wrong image. A
    non-finite reconstruction, a failed attack's (``None``), a missing one and one given as a
    label (``NOT_KEPT``) are each labelled in place, not left blank; a (defense, attack) that was
    not run at all is an empty cell.
    """
    items = [_as_entry(e) for e in entries]
    if not items:
        raise TableError("reconstruction_grid: no entries given.")
    rows = list(dict.fromkeys((e.dataset, e.defense_label) for e in items))
    attacks = list(dict.fromkeys(e.attack_label for e in items))
    shown: dict[str, list[int]] = {}
    for e in items:
        if e.victim not in shown.setdefault(e.dataset, []) and len(shown[e.dataset]) < victims:
            shown[e.dataset].append(e.victim)
    width = max(len(v) for v in shown.values())
    originals: dict[tuple[str, int], np.ndarray | None] = {}
    cells: dict[tuple[str, str, str, int], np.ndarray | str | None] = {}
    side = 0
    for e in items:
        col = (e.dataset, e.victim)
        original = _image(e.original, f"original of {col}")
        if col in originals and not _same(originals[col], original):
            raise TableError(f"reconstruction_grid: two different originals for {col}.")
        originals[col] = original
        side = max(side, 0 if original is None else original.shape[0])
        cells[(e.dataset, e.defense_label, e.attack_label, e.victim)] = (
            FAILED
            if e.reconstruction is None
            else e.reconstruction
            if isinstance(e.reconstruction, str)
            else _image(
                e.reconstruction, f"reconstruction of {e.defense_label}/{e.attack_label}/{col}"
            )
        )
    ran = {(d, row, a) for d, row, a, _ in cells}
    # a tile of at least 0.64 inch: a 32x32 image at two screen pixels per pixel
    tile = max(0.64, side / DPI)
    groups = ["Original", *attacks]
    ratios = [r for g in range(len(groups)) for r in ([0.25] if g else []) + [1.0] * width]
    gaps = 0.08  # between tiles, as a fraction of a tile
    inner_w = tile * (sum(ratios) + gaps * (len(ratios) - 1))
    inner_h = tile * (len(rows) + gaps * (len(rows) - 1))
    margins = {"left": 1.8, "right": 0.1, "top": 0.35, "bottom": 0.3}  # inches: labels, titles
    fig = Figure(
        figsize=(inner_w + margins["left"] + margins["right"], inner_h + margins["top"] + 0.3)
    )
    width_in, height_in = fig.get_figwidth(), fig.get_figheight()
    grid = fig.add_gridspec(
        len(rows),
        len(ratios),
        width_ratios=ratios,
        wspace=gaps,
        hspace=gaps,
        left=margins["left"] / width_in,
        right=1 - margins["right"] / width_in,
        top=1 - margins["top"] / height_in,
        bottom=margins["bottom"] / height_in,
    )
    for i, (dataset, row) in enumerate(rows):
        for g, group in enumerate(groups):
            for k in range(width):
                ax = fig.add_subplot(grid[i, g * (width + 1) + k])
                ax.set_xticks([])
                ax.set_yticks([])
                victim = shown[dataset][k] if k < len(shown[dataset]) else None
                if g == 0:
                    image = originals.get((dataset, victim)) if victim is not None else None
                    empty = victim is None
                else:
                    empty = victim is None or (dataset, row, group) not in ran
                    image = cells.get((dataset, row, group, victim), MISSING)
                if empty:
                    ax.axis("off")
                else:
                    _draw(ax, image)
                if i == 0 and k == 0:
                    ax.set_title(group or "—", fontsize=8, loc="left")
                if i == len(rows) - 1 and victim is not None:  # drawn under an empty tile too
                    ax.annotate(
                        f"victim {victim}",
                        xy=(0.5, 0),
                        xycoords="axes fraction",
                        xytext=(0, -3),
                        textcoords="offset points",
                        ha="center",
                        va="top",
                        fontsize=6,
                    )
                if g == 0 and k == 0:
                    label = row if len(shown) == 1 else f"{dataset}\n{row}"
                    ax.set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
    save_figure(fig, out_path, caption)


def _draw(ax: Any, image: np.ndarray | str | None) -> None:
    """An image pixel for pixel, or what stands in its place: its label ("missing",
    "failed"), or "non-finite" (``None``)."""
    if isinstance(image, np.ndarray):
        ax.imshow(
            image,
            cmap="gray" if image.ndim == 2 else None,
            vmin=0,
            vmax=1,
            interpolation="nearest",  # upscaled without smoothing: the pixels the attack made
        )
        return
    ax.text(
        0.5,
        0.5,
        image if isinstance(image, str) else "non-\nfinite",
        ha="center",
        va="center",
        fontsize=6,
        transform=ax.transAxes,
        color="firebrick",
    )


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b))
