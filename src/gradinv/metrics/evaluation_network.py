"""Refiner's evaluation network: what it is, how it is trained, and its weights file. The
privacy metric built on it, the predicted noise ratio, is :mod:`gradinv.metrics.noise_ratio`.

Refiner (Fan et al., USENIX Security 2025, arXiv:2212.02042), Section 3.3: a network ``D``
that predicts the proportion ``r`` of uniform noise in an image, trained on pairs
``((1 - r) * t1 + r * t2, r)`` with ``t1`` a natural image and ``t2 ~ U(0, 1)``. Refiner's
defense maximises ``D`` of the data it shares (its privacy term backpropagates through ``D`` into
the image); as a metric (its Section 5, Appendices L and N) ``D(reconstruction)`` says how little
of a natural image an attack recovered: higher is better privacy, and the paper takes 0.4 as the
point where people no longer see private content. It needs no original (a no-reference metric).
Threat model: the network is public (trained on public data, the paper's TinyImageNet; here each
dataset's public split, ``partition.public_fraction``, which no client holds).

Architecture and training follow Appendix D: three 3x3 convolutions of stride 2 and padding 1
with ReLU (``width``, ``2 * width``, ``4 * width`` filters; the paper's 128, 256, 512), a fully
connected layer and a sigmoid; Adam, learning rate 1e-4, batch 128, 20 epochs, every batch mixed
with noise at the 11 ratios 0, 0.1, ..., 1 before the next. No official code exists; where the
paper is silent this module chooses:

- **Loss: binary cross-entropy against the soft target r** (on the logit, which is numerically
  stable), not MSE. Equation 5 is a cross-entropy (``log(1 - D)`` for natural images, ``log D``
  for noise), and BCE with soft labels keeps its minimiser ``D(x) = E[r | x]``. Through a sigmoid,
  MSE's gradient carries a factor ``D (1 - D)`` that vanishes exactly at the clean and the
  pure-noise ends, which the metric's readings depend on; BCE's gradient on the logit is
  ``D - r``. Its floor is the binary entropy ``H(r) > 0`` for ``0 < r < 1``, so the logged loss
  does not go to 0; ``abs_error`` (mean ``|D - r|``) is logged beside it.
- **The 11 mixtures are 11 optimiser steps** on the same batch ("mixed 11 times before proceeding
  to the next batch"), not one step on an 11-fold batch; their order is shuffled per batch (from
  the job's generator), so that the last update before any point of training is not always the
  pure-noise one.
- **Noise**: fresh ``U(0, 1)`` for every pixel *and channel* (the uniform distribution on the image
  cube, the paper's ``q``), drawn anew for every mixture; ratios ``linspace(0, 1, ratios)``.
- **Inputs** are the images in [0, 1] as they are (no normalisation), so the defense and the metric
  feed ``D`` the same images the attacks produce. An epoch is one pass over the images in a
  random order, its last batch possibly smaller; no augmentation.
- Weights start from PyTorch's default initialisation, drawn from the job's generator.

With ``width`` 128 the network has about 1.49 M parameters (the paper: "approximately 1MB").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.io import (
    CorruptFileError,
    content_digest,
    load_tensors,
    save_tensors,
    snakemake_command,
)
from gradinv.metrics.base import MetricSettings
from gradinv.paths import EVALUATION_NETWORKS, evaluation_network_path
from gradinv.progress import Progress
from gradinv.settings import bounded

log = logging.getLogger(__name__)

KIND = "refiner_evaluation_network"
ROOT = EVALUATION_NETWORKS
# Refiner's Appendix N: at a predicted ratio of 0.4 people no longer see the private image.
PRIVACY_THRESHOLD = 0.4
# Images per forward pass when scoring or calibrating: bounds memory, not results.
CHUNK = 256
_ARCHITECTURE = ("in_channels", "image_size", "width")


class EvaluationNetworkUnavailableWarning(UserWarning):
    """noise_ratio cannot be computed here: no evaluation network file was given or found."""


@dataclass(frozen=True)
class EvaluationNetworkSettings:
    """The ``evaluation_network`` block of params.yaml (its ``label`` aside): Appendix D."""

    width: int = bounded(128, ge=1, doc="filters of the first convolution; then 2x and 4x")
    epochs: int = bounded(20, ge=1, doc="passes over the public split")
    batch_size: int = bounded(128, ge=1, doc="public images per batch")
    lr: float = bounded(1e-4, gt=0.0, doc="Adam learning rate")
    ratios: int = bounded(
        11, ge=2, doc="noise ratios linspace(0, 1, ratios); one optimiser step each per batch"
    )
    log_every: int = bounded(20, ge=1, doc="optimiser steps between history points")


class EvaluationNetwork(nn.Module):
    """``D``: images ``(N, C, H, W)`` in [0, 1] -> predicted noise ratio ``(N,)`` in [0, 1].

    Differentiable in its input (Refiner's defense optimises an image through it), with no
    in-place operation, so the same graph may be used twice.
    """

    def __init__(self, in_channels: int, image_size: int, width: int = 128) -> None:
        super().__init__()
        if in_channels < 1 or image_size < 1 or width < 1:
            raise ValueError(
                f"EvaluationNetwork({in_channels}, {image_size}, {width}): all must be >= 1"
            )
        self.in_channels, self.image_size, self.width = in_channels, image_size, width
        widths = (in_channels, width, 2 * width, 4 * width)
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Conv2d(a, b, kernel_size=3, stride=2, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers, nn.Flatten())
        side = image_size
        for _ in range(3):  # a 3x3 convolution of stride 2 and padding 1 halves, rounding up
            side = (side + 1) // 2
        self.head = nn.Linear(4 * width * side * side, 1)

    def logits(self, x: Tensor) -> Tensor:
        """The pre-sigmoid output ``(N,)`` (training takes the cross-entropy on it)."""
        expected = (self.in_channels, self.image_size, self.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"the evaluation network takes images of shape (N, {', '.join(map(str, expected))})"
                f"; got {tuple(x.shape)}: use the network trained for this dataset"
            )
        return self.head(self.features(x)).squeeze(1)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.logits(x))


def mix_with_noise(images: Tensor, ratios: float | Tensor, generator: torch.Generator) -> Tensor:
    """``(1 - r) * images + r * u`` with ``u ~ U(0, 1)`` per pixel and channel.

    ``ratios`` is one ratio or one per image ``(N,)``. The noise is drawn on the CPU from
    ``generator`` (so a run is the same on every device) and moved to the images' device.
    """
    noise = torch.rand(images.shape, generator=generator).to(images.device, images.dtype)
    r = torch.as_tensor(ratios, dtype=images.dtype, device=images.device)
    if r.ndim == 1:
        r = r.view(-1, 1, 1, 1)
    return (1 - r) * images + r * noise


def train_evaluation_network(
    images: Tensor,
    settings: EvaluationNetworkSettings,
    generator: torch.Generator,
    progress: Progress | None = None,
    device: torch.device | str = "cpu",
) -> tuple[EvaluationNetwork, dict[str, list[tuple[int, float]]]]:
    """Train ``D`` on ``images`` ((N, C, S, S) in [0, 1]) as the module doc says, on ``device``.

    Returns the network (on the CPU, eval mode, frozen) and its curves: ``loss`` (the
    cross-entropy) and ``abs_error`` (mean ``|D - r|``), each the mean over one batch's mixtures,
    keyed by the optimiser steps done. Resumable through ``progress`` at batch boundaries: a
    resumed run equals an uninterrupted one bit for bit on the CPU.
    """
    s = settings
    if images.ndim != 4 or images.shape[2] != images.shape[3] or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch of square images; got {tuple(images.shape)}")
    n, channels, side = images.shape[0], images.shape[1], images.shape[2]
    device = torch.device(device)
    # The initial weights come from the job's generator, not from torch's global seed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))
        network = EvaluationNetwork(channels, side, s.width)
    network.to(device)
    optimiser = torch.optim.Adam(network.parameters(), lr=s.lr)
    ratios = torch.linspace(0, 1, s.ratios).tolist()
    batches = math.ceil(n / s.batch_size)
    total = s.epochs * batches
    history: dict[str, list[tuple[int, float]]] = {"loss": [], "abs_error": []}
    start, order = 0, torch.arange(n)
    saved = progress.load() if progress else None
    if saved is not None:
        network.load_state_dict(saved["network"])
        optimiser.load_state_dict(saved["optimiser"])
        generator.set_state(saved["generator"])
        start, order, history = saved["batch"], saved["order"], saved["history"]
        progress.resumed(f"batch {start} of {total}")

    data = images.to(torch.float32)
    began = time.perf_counter()
    network.train()
    for b in range(start, total):
        epoch, i = divmod(b, batches)
        if i == 0:
            order = torch.randperm(n, generator=generator)
        x = data[order[i * s.batch_size : (i + 1) * s.batch_size]].to(device)
        losses, errors = [], []
        for k in torch.randperm(len(ratios), generator=generator).tolist():
            mixed = mix_with_noise(x, ratios[k], generator)
            logit = network.logits(mixed)
            target = torch.full_like(logit, ratios[k])
            loss = F.binary_cross_entropy_with_logits(logit, target)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.detach())
            errors.append((torch.sigmoid(logit.detach()) - target).abs().mean())
        loss_mean = torch.stack(losses).mean().item()
        if not math.isfinite(loss_mean):
            raise RuntimeError(
                f"evaluation network training diverged at epoch {epoch}, batch {i} "
                "(non-finite loss)"
            )
        steps = (b + 1) * len(ratios)
        if b in (0, total - 1) or steps // s.log_every > (steps - len(ratios)) // s.log_every:
            error_mean = torch.stack(errors).mean().item()
            history["loss"].append((steps, loss_mean))
            history["abs_error"].append((steps, error_mean))
            rate = (b + 1 - start) * len(ratios) / max(time.perf_counter() - began, 1e-9)
            print(
                f"gradinv: evaluation network epoch {epoch + 1}/{s.epochs}, step {steps}/"
                f"{total * len(ratios)}: loss {loss_mean:.4f}, |D - r| {error_mean:.4f} "
                f"({rate:.1f} steps/s)",
                file=sys.stderr,
                flush=True,
            )
        if progress and progress.due():
            progress.save(
                {
                    "batch": b + 1,
                    "order": order,
                    "network": network.state_dict(),
                    "optimiser": optimiser.state_dict(),
                    "generator": generator.get_state(),
                    "history": history,
                }
            )
    network.to("cpu").eval()
    network.requires_grad_(False)
    return network, history


def calibration(
    network: EvaluationNetwork,
    images: Tensor,
    ratios: Sequence[float] | Tensor,
    generator: torch.Generator,
) -> list[dict[str, float]]:
    """Mean and standard deviation (over ``images``) of ``D`` at each true ratio: Refiner's
    Fig. 4. ``images`` must be held out of training; ``D`` runs on its parameters' device."""
    device = next(network.parameters()).device
    rows = []
    with torch.no_grad():
        for r in torch.as_tensor(ratios, dtype=torch.float64).tolist():
            predictions = torch.cat(
                [
                    network(mix_with_noise(images[k : k + CHUNK], r, generator).to(device))
                    .double()
                    .cpu()
                    for k in range(0, images.shape[0], CHUNK)
                ]
            )
            rows.append(
                {
                    "ratio": round(r, 6),
                    "mean": predictions.mean().item(),
                    "std": predictions.std(correction=0).item(),
                }
            )
    return rows


# ------------------------------------------------------------------------------------- files


def resolve_evaluation_network(settings: MetricSettings, dataset: str) -> MetricSettings:
    """``settings`` with an empty ``evaluation_network`` replaced by ``dataset``'s own network
    (``data/evalnet/<dataset>.pt`` in the run's folder), as ``metrics.evaluation_network``
    documents; the scoring stage knows the dataset, the metric does not. A path the settings
    name is a file of the user's, found from the project's folder."""
    from gradinv.config import run_root

    if settings.evaluation_network:
        return settings
    own = run_root() / evaluation_network_path(dataset)
    return dataclasses.replace(settings, evaluation_network=str(own))


def make_command(path: str | Path) -> str:
    """The command that makes the network at ``path``: Snakemake's, for the pipeline's layout."""
    path = Path(path)
    dataset = path.stem if path.parent.name == ROOT.name else "<dataset>"
    return snakemake_command(evaluation_network_path(dataset))


def save_evaluation_network(path: str | Path, network: EvaluationNetwork, **meta: Any) -> str:
    """Write ``network`` (weights on the CPU, its architecture) and ``meta`` (what produced it)
    atomically, with a checksum of the content; return the file's sha256."""
    reserved = {"kind", "state", *_ARCHITECTURE} & set(meta)
    if reserved:
        raise ValueError(f"metadata keys {sorted(reserved)} are the file's own")
    return save_tensors(
        path,
        {
            "kind": KIND,
            **{key: getattr(network, key) for key in _ARCHITECTURE},
            "state": {k: v.detach().cpu() for k, v in network.state_dict().items()},
            **meta,
        },
    )


def weights_digest(path: str | Path) -> str:
    """The sha256 of a saved network's weights alone: what identifies the network in the records
    of the runs that used it (the file also holds its training time, which differs between two
    otherwise identical trainings)."""
    return content_digest(load_tensors(Path(path))["state"])


def load_evaluation_network(path: str | Path) -> EvaluationNetwork:
    """The network saved at ``path``, on the CPU, in eval mode, its parameters frozen.

    A missing file is a :class:`FileNotFoundError` naming the command that makes it; a truncated,
    altered or foreign one a :class:`~gradinv.io.CorruptFileError`.
    """
    path = Path(path)
    command = make_command(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"the evaluation network {path} does not exist. Make it with: {command}"
        )
    remedy = f"{command} --forcerun train_evalnet"
    saved = load_tensors(path, remedy=remedy)
    missing = [k for k in ("kind", "state", *_ARCHITECTURE) if k not in saved]
    if missing or saved["kind"] != KIND:
        what = f"lacks {', '.join(missing)}" if missing else f"holds a {saved['kind']!r}"
        raise CorruptFileError(
            f"{path} is not an evaluation network file ({what}). Regenerate it with: {remedy}"
        )
    network = EvaluationNetwork(*(int(saved[k]) for k in _ARCHITECTURE))
    try:
        network.load_state_dict(saved["state"])
    except RuntimeError as err:
        raise CorruptFileError(
            f"{path} does not fit its recorded architecture ({err}). Regenerate it with: {remedy}"
        ) from err
    network.eval()
    network.requires_grad_(False)
    return network


@functools.lru_cache(maxsize=8)
def _cached(path: str, size: int, mtime_ns: int, device: str) -> EvaluationNetwork:
    # Keyed by size and mtime too: a network retrained in this process is read again.
    return load_evaluation_network(path).to(device)


def cached_evaluation_network(path: str | Path, device: torch.device | str) -> EvaluationNetwork:
    """:func:`load_evaluation_network`, once per file and device in this process."""
    stat = Path(path).stat()
    return _cached(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns, str(device))
