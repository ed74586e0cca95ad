"""A grid of reconstructions (CENSOR Fig. 6): the private images in the first row, then one row
per defense and attack, one column per victim. Saved with its caption by
:func:`gradinv.tables.figures.save_figure`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gradinv.tables.aggregate import TableError
from gradinv.tables.figures import save_figure


@dataclass(frozen=True)
class GridEntry:
    """One reconstruction: which run it came from, the private image and the attacker's image."""

    dataset: str
    defense_label: str
    attack_label: str
    victim: int
    original: Any  # float tensor or array (C, H, W) in [0, 1]
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
) -> None:
    """Originals in the first row, then one row per defense × attack; columns are victims.

    Rows and columns follow the order of first appearance in ``entries``, so the caller decides
    the layout. Two different originals for the same (dataset, victim) are an error: the grid
    would otherwise compare a reconstruction against the wrong image. A non-finite
    reconstruction (failed run) and a missing one are labelled in place, not left blank.
    """
    items = [_as_entry(e) for e in entries]
    if not items:
        raise TableError("reconstruction_grid: no entries given.")
    columns = list(dict.fromkeys((e.dataset, e.victim) for e in items))
    row_keys = list(dict.fromkeys((e.defense_label, e.attack_label) for e in items))
    originals: dict[tuple[str, int], np.ndarray | None] = {}
    cells: dict[tuple[tuple[str, str], tuple[str, int]], np.ndarray | None] = {}
    for e in items:
        col = (e.dataset, e.victim)
        original = _image(e.original, f"original of {col}")
        if col in originals and not _same(originals[col], original):
            raise TableError(f"reconstruction_grid: two different originals for {col}.")
        originals[col] = original
        cells[((e.defense_label, e.attack_label), col)] = _image(
            e.reconstruction, f"reconstruction of {e.defense_label}/{e.attack_label}/{col}"
        )
    size = 1.4
    fig = Figure(figsize=(size * len(columns) + 1.6, size * (len(row_keys) + 1) + 0.3))
    axes = fig.subplots(len(row_keys) + 1, len(columns), squeeze=False)
    grid_rows = [("Original", originals)] + [
        (f"{rk[0]}\n{rk[1]}", {c: cells.get((rk, c), "missing") for c in columns})
        for rk in row_keys
    ]
    for i, (row_label, images) in enumerate(grid_rows):
        for j, col in enumerate(columns):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            image = images.get(col, "missing")
            if isinstance(image, np.ndarray):
                ax.imshow(
                    image,
                    cmap="gray" if image.ndim == 2 else None,
                    vmin=0,
                    vmax=1,
                    interpolation="nearest",
                )
            else:
                text = "missing" if isinstance(image, str) else "non-finite"
                ax.text(
                    0.5,
                    0.5,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    transform=ax.transAxes,
                    color="firebrick",
                )
            if i == 0:
                ax.set_title(f"{col[0]}\nvictim {col[1]}", fontsize=7)
            if j == 0:
                ax.set_ylabel(row_label, fontsize=7, rotation=0, ha="right", va="center")
    fig.tight_layout()
    save_figure(fig, out_path, caption)


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b))
