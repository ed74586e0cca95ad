"""Does an attack work at all? Its reconstruction against the floor, victim by victim.

The floor (:mod:`gradinv.stages.floor`) is the public split's mean image, scored against every
victim with the attack's own metrics. An attack's *gain* on a victim is how much closer its
reconstruction is than the floor, oriented so that positive means the attacker did better:
value − floor for PSNR and SSIM (higher is closer), floor − value for MSE, LPIPS and the noise
ratio (lower is closer). An undefended attack that does not beat the floor on the median victim
has recovered nothing a defense could take away: the claims over it are *undecidable at this
scale* (:mod:`gradinv.claims`), and each table's Markdown says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gradinv.tables.aggregate import metric_spec
from gradinv.tables.files import floor_column

UNDEFENDED = "none"
FLOORED = ("mse", "psnr", "ssim", "lpips", "noise_ratio")  # the image metrics the floor scores


@dataclass(frozen=True)
class FloorCheck:
    """The median gain over the floor of one cell's victims, how many, and the answer."""

    median_gain: float
    n: int

    @property
    def beats(self) -> bool | None:
        """True/False; None when no victim has both values."""
        return None if self.n == 0 else bool(self.median_gain > 0)


def gains(victims: pd.DataFrame, metric: str) -> np.ndarray:
    """The attack's gain over the floor on each victim with both values (module docstring)."""
    column = floor_column(metric)
    if metric not in FLOORED or column not in victims.columns:
        return np.array([])
    ok = victims[(victims["status"] == "ok") & victims[metric].notna() & victims[column].notna()]
    value, floor = ok[metric].to_numpy(float), ok[column].to_numpy(float)
    gain = value - floor if metric_spec(metric).arrow == "↓" else floor - value
    return gain[~np.isnan(gain)]


def floor_check(victims: pd.DataFrame, metric: str) -> FloorCheck:
    g = gains(victims, metric)
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
