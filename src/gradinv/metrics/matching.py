"""Hungarian matching of reconstructions to originals, for batches of more than one image.

An attack recovers a batch as an unordered set: reconstruction ``i`` need not be the image the
client stored at ``i``. Before scoring, each reconstruction is paired with one original so that
the summed pairwise cost is minimal (Kuhn's Hungarian method, ``scipy.optimize.
linear_sum_assignment``), as breaching does (there on LPIPS distances; here MSE by default, which
needs no network). A metric where higher means more alike (PSNR, SSIM) enters as its negative.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import MetricSettings, Stats, check_images


def cost_matrix(
    recon: Tensor,
    orig: Tensor,
    cost: str = "mse",
    settings: MetricSettings | None = None,
    mean: Stats | None = None,
    std: Stats | None = None,
) -> np.ndarray:
    """``C[i, j]``: how unlike reconstruction ``i`` is original ``j`` under metric ``cost``."""
    settings = settings or MetricSettings()
    metric = METRICS.get(cost)()
    result = metric.pairwise(recon, orig, settings, mean, std)
    if result.per_image is None:
        raise RuntimeError(
            f"cannot match on {cost}: {result.status}. Match on 'mse' instead (metrics.match_cost)."
        )
    values = np.asarray(result.per_image, dtype=np.float64).reshape(len(recon), len(orig))
    # defender_direction "up": a larger value is a worse reconstruction, i.e. a worse match.
    matrix = values if metric.defender_direction == "up" else -values
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"the {cost} cost matrix has non-finite entries; match on 'mse'.")
    return matrix


def match_reconstructions(
    recon: Tensor,
    orig: Tensor,
    *,
    cost: str = "mse",
    settings: MetricSettings | None = None,
    mean: Stats | None = None,
    std: Stats | None = None,
) -> list[int]:
    """The assignment ``perm`` that pairs ``recon[perm[j]]`` with ``orig[j]`` at minimal cost.

    ``recon[perm]`` is then in the originals' order. There may be more reconstructions than
    originals (a shared batch with added samples, DCS²'s concealed ones): each original gets its
    own best-matching reconstruction and the others are left out. Images in ``[0, 1]``; ``cost``
    names a registered metric ("mse", "ssim" or "lpips").
    """
    check_images(recon, orig, same_count=False)
    n = orig.shape[0]
    if recon.shape[0] == 1:
        return [0]
    matrix = cost_matrix(recon, orig, cost, settings, mean, std)
    rows, cols = linear_sum_assignment(matrix.T)  # rows: originals, in order 0..n-1
    if not np.array_equal(rows, np.arange(n)):
        raise RuntimeError("linear_sum_assignment did not assign every original.")
    return [int(c) for c in cols]
