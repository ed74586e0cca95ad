"""Does an attack work at all? Its reconstruction against the floor, victim by victim.

The floor (:mod:`gradinv.stages.floor`) is the public split's mean image, scored against every
victim with the attack's own metrics. An attack's *gain* on a victim is how much closer its
reconstruction is than the floor, positive where the attacker did better
(:func:`gradinv.tables.aggregate.floor_gains`, which also gives every table cell its median
gain). An undefended attack that does not beat the floor on the median victim has recovered
nothing a defense could take away: the claims over it are *undecidable at this scale*
(:mod:`gradinv.claims`), and each table's Markdown says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gradinv.tables.aggregate import FLOORED, floor_gains

UNDEFENDED = "none"
__all__ = ["FLOORED", "UNDEFENDED", "FloorCheck", "floor_check", "undefended_checks"]


@dataclass(frozen=True)
class FloorCheck:
    """The median gain over the floor of one cell's victims, how many, and the answer."""

    median_gain: float
    n: int

    @property
    def beats(self) -> bool | None:
        """True/False; None when no victim has both values."""
        return None if self.n == 0 else bool(self.median_gain > 0)


def floor_check(victims: pd.DataFrame, metric: str) -> FloorCheck:
    """The median gain of ``victims`` over the floor (:func:`.aggregate.floor_gains`)."""
    g = floor_gains(victims, metric)
    return FloorCheck(float(np.median(g)) if len(g) else math.nan, len(g))


def undefended_checks(victims: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """For each undefended cell of a table's victims (defense ``none``): per metric the median
    gain over the floor, n, and whether it beats it."""
    keys = ["dataset", "model", "attack", "round", "batch_size"]
    rows = []
    undefended = victims[victims["defense"] == UNDEFENDED]
    for key, cell in undefended.groupby(keys, sort=False):
        for metric in metrics:
            if metric not in FLOORED:
                continue
            check = floor_check(cell, metric)
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "attack_label": cell["attack_label"].iloc[0]
                    if "attack_label" in cell
                    else key[2],
                    "metric": metric,
                    "median_gain": check.median_gain,
                    "n": check.n,
                    "beats_floor": check.beats,
                }
            )
    return pd.DataFrame.from_records(
        rows, columns=[*keys, "attack_label", "metric", "median_gain", "n", "beats_floor"]
    )
