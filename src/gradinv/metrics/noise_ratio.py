"""The privacy metric ``noise_ratio``: the noise ratio Refiner's evaluation network (Fan et al.,
USENIX Security 2025, arXiv:2212.02042; :mod:`gradinv.metrics.evaluation_network`) predicts for
a reconstruction, by itself (no original needed). Higher is better privacy; the paper takes 0.4
as the point where people no longer see private content. Without the network's file the metric
is unavailable: recorded as None with the reason, loudly, never computed with another network.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path

import torch
from torch import Tensor

from gradinv.metrics import METRICS
from gradinv.metrics.base import ImageMetric, MetricSettings, MetricValues, Stats
from gradinv.metrics.evaluation_network import (
    CHUNK,
    EvaluationNetworkUnavailableWarning,
    cached_evaluation_network,
    make_command,
)

log = logging.getLogger(__name__)


def _locate(configured: str) -> tuple[Path | None, str]:
    """The network file ``metrics.evaluation_network`` names, or ``None`` and why not."""
    if not configured:
        return None, (
            "metrics.evaluation_network is empty and no dataset's network was filled in "
            "(resolve_evaluation_network); the pipeline trains one per dataset: "
            f"{make_command('<dataset>')}"
        )
    path = Path(configured).expanduser()
    if not path.is_absolute():
        from gradinv.config import project_root  # params.yaml's paths are the project's

        path = project_root() / path
    if not path.is_file():
        return None, f"the evaluation network {path} does not exist; make it with: " + (
            make_command(path)
        )
    return path, "ok"


@METRICS.register("noise_ratio")
class NoiseRatio(ImageMetric):
    """``D(reconstruction)``: the noise ratio Refiner's evaluation network sees in it."""

    name = "noise_ratio"
    label = "NoiseRatio"
    defender_direction = "up"
    best = 0.0
    reports_status = True

    def per_image(
        self,
        recon: Tensor,
        orig: Tensor,
        settings: MetricSettings,
        mean: Stats | None = None,
        std: Stats | None = None,
    ) -> MetricValues:
        path, reason = _locate(settings.evaluation_network)
        if path is None:
            message = f"noise_ratio is unavailable and is recorded as None: {reason}"
            log.warning(message)
            warnings.warn(message, EvaluationNetworkUnavailableWarning, stacklevel=2)
            return MetricValues(None, f"unavailable: {reason}")
        network = cached_evaluation_network(path, recon.device)
        x = recon.detach().float()
        with torch.no_grad():
            values = torch.cat([network(x[k : k + CHUNK]) for k in range(0, x.shape[0], CHUNK)])
        result = values.double().cpu().tolist()
        if not all(map(math.isfinite, result)):
            raise FloatingPointError(f"the evaluation network {path} produced {result}.")
        return MetricValues(result)
