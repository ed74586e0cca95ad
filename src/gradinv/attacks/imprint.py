"""Imprint, "Robbing the Fed" (Fowl et al. 2021, arXiv:2110.13057): a malicious-server attack.

Threat model: a *malicious* server. It inserts an imprint block in front of the model it sends
(same weights otherwise) and reads the victim's images straight out of the block's gradient; no
optimization, no prior. The victim's (defended) update must be computed on the imprinted model:
the capture stage does this for an attack whose ``server`` is ``"malicious"``
(:func:`gradinv.attacks.malicious_server`).

The block (:class:`ImprintBlock`, parameters ``imprint.0.*`` and ``imprint.2.*``; the wrapped
model's own parameters keep their names under ``model.``): flatten the normalized image x, a
linear layer to ``bins`` units whose rows all compute the same measurement m(x) (the average
pixel, breaching's ``avg``), biases -e_i at bin edges e_0 < ... < e_{K-1}, a ReLU, and a linear
layer back to the image's size whose columns are all ones. Unit i fires for the samples with
m(x) > e_i, and because every column of the second layer is the same, the loss's derivative by
unit i's output is one number g(x) for every unit a sample fires. Hence for the bins sorted by
edge, with the sums over the batch,

    dL/dW_i - dL/dW_{i+1} = sum over x with e_i < m(x) <= e_{i+1} of g(x) x
    dL/db_i - dL/db_{i+1} = sum over the same x of g(x)

(dL/dW_K = 0 above the last edge): their ratio *is* the image when one sample alone falls in
bin i, and the g-weighted mixture of the images when several share it. The edges are quantiles
of a Gaussian model N(``mean``, ``std``) of the measurement, ``e_i = mean + std * Phi^-1(i/K)``,
so each bin holds 1/K of that Gaussian's mass; the lowest, Phi^-1(0) = -inf, is ``mean - 10
std`` as in breaching (every image fires bin 0). The attacker keeps the ``batch_size`` bins with
the largest bias difference; a bin whose difference is at the rounding floor of the shared
float32 sums carries no sample, and its place is filled with a uniform grey image (counted in
``summary["recovered"]``, never passed off as a reconstruction). Breaching picks its bins by the
mean weight difference instead (its choice under noise); the paper does not say. Breaching's
``ImprintAttacker`` also differences the other way (bin i less bin i-1) and keeps bin 0 as it
is: its bin 0 is the whole batch's sum and a sample above the last edge is never read alone;
here the last bin is read alone (nothing above it), so all K intervals can hold one image.

What the block outputs is a setting (``connection``); the recovery is exact either way, as it
only needs the second layer's columns to be equal:

- ``replace`` (default): the block's output replaces the image, as breaching's ``ImprintBlock``
  (``connection: linear``), which the DCS² code ran against (10 bins, Table 1). Every
  pixel the model then sees is the same number, a function of m(x): the model no longer sees the
  image, which a client could notice by its accuracy, and an honest attack on such a capture has
  only the block to go on. Labels inferred from the classifier's gradient suffer too: every
  sample's features are alike (the row rule misses one label of six on LeNet in the tests).
- ``add``: the block's output is added to the image (the model sees the image shifted by a
  constant): the server keeps a working model, and the rest of the gradient still carries the
  image for an honest attack.

Where this differs from breaching: no ``gain`` (breaching's RtF config uses 1.0), only the
average-pixel measurement (breaching's RtF config uses a DCT ``fourier`` measurement with
Laplace bins, 64 bins), and the second layer's bias is set to centre the block's output at the
Gaussian's mean (``-sum_i ReLU(mean - e_i)``) rather than breaching's random initialization less
the mean edge; every weight follows from the settings, no draw. breaching's ImprintBlock's
defaults are ``mean`` 0, ``std`` 1 (``NormalDist()``), in the model's normalized input space;
the average normalized pixel of a real data set usually spreads less than that, so the outer bins
are seldom hit, as in breaching. A FedAvg delta is read as its negative (a gradient step);
exact for one local step, approximate for several, as the block's weights (hence its bins) and
g(x) move between steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import torch
from torch import Tensor, nn

from gradinv.attacks import ATTACKS
from gradinv.attacks.base import CPU, Attack, AttackFailed, AttackResult, MatchSettings
from gradinv.progress import Progress
from gradinv.protocol import ModelSpec, ServerMessage, SharedUpdate, denormalize
from gradinv.settings import bounded, from_mapping

BLOCK = "imprint"  # the block's name in the changed model; the wrapped model sits under "model"
WEIGHT, BIAS = f"{BLOCK}.0.weight", f"{BLOCK}.0.bias"  # the measurement layer: what is read
LOWEST = -10.0  # the lowest edge, in stds below the mean (breaching's -10: every image fires)
SIGNAL = 1e-6  # a bias difference below this times the largest bias gradient is rounding
GREY = 0.5  # the pixel value of a batch slot no bin filled


class ImprintBlock(nn.Sequential):
    """Linear (measurement, ``bins`` rows) -> ReLU -> Linear (back to the image's size), on the
    flattened image; its output replaces the image or is added to it (``connection``)."""

    def __init__(
        self,
        shape: tuple[int, int, int],
        edges: list[float],
        mean: float,
        connection: Literal["replace", "add"],
    ) -> None:
        size, k = shape[0] * shape[1] * shape[2], len(edges)
        # skip_init: no draw from the global generator; every weight is set below
        super().__init__(
            nn.utils.skip_init(nn.Linear, size, k),
            nn.ReLU(),
            nn.utils.skip_init(nn.Linear, k, size),
        )
        self.connection = connection
        e = torch.tensor(edges, dtype=torch.float64)
        with torch.no_grad():
            self[0].weight.fill_(1.0 / size)  # every row: the average pixel
            self[0].bias.copy_(-e)
            self[2].weight.fill_(1.0)  # equal columns: one g(x) for every bin a sample fires
            self[2].bias.fill_(-float(torch.relu(mean - e).sum()))  # zero at the mean

    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x.flatten(1)).reshape(x.shape)
        return x + out if self.connection == "add" else out


class Imprinted(nn.Module):
    """The model a malicious server sends: the imprint block, then the original model."""

    def __init__(self, imprint: ImprintBlock, model: nn.Module) -> None:
        super().__init__()
        self.imprint = imprint
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.imprint(x))


def bin_edges(bins: int, mean: float, std: float) -> list[float]:
    """The K ascending bin edges: quantiles i/K of N(mean, std), the lowest mean - 10 std."""
    gauss = NormalDist(mean, std)
    return [mean + LOWEST * std] + [gauss.inv_cdf(i / bins) for i in range(1, bins)]


@ATTACKS.register("imprint")
class Imprint(Attack):
    server = "malicious"

    @dataclass(frozen=True)
    class Settings(MatchSettings):
        bins: int = bounded(10, ge=2, doc="imprint bins (DCS2's code: 10; breaching's RtF: 64)")
        mean: float = bounded(0.0, doc="mean of the Gaussian model of the average pixel")
        std: float = bounded(1.0, gt=0.0, doc="std of the Gaussian model of the average pixel")
        connection: Literal["replace", "add"] = "replace"

    # The settings that shape the block: the capture's model must have been made with these.
    modification_fields = ("bins", "mean", "std", "connection")

    @classmethod
    def budget(cls, settings: Settings) -> str:
        return f"analytic: one read of {settings.bins} imprint bins (no iterations)"

    def malicious_model(self, model: nn.Module, spec: ModelSpec) -> nn.Module:
        s = self.settings
        block = ImprintBlock(
            (spec.in_channels, spec.image_size, spec.image_size),
            bin_edges(s.bins, s.mean, s.std),
            s.mean,
            s.connection,
        )
        param = next(model.parameters(), None)
        if param is not None:
            block.to(device=param.device, dtype=param.dtype)
        return Imprinted(block, model)

    def describe(self, spec: ModelSpec) -> str:
        s = self.settings
        verb = "replaces" if s.connection == "replace" else "is added to"
        return (
            f"malicious: imprint block of {s.bins} bins before {spec.name} (average pixel, "
            f"edges at quantiles of N({s.mean:g}, {s.std:g})); its output {verb} the input"
        )

    def check_capture(self, server: ServerMessage) -> None:
        """The capture must be of the imprinted model with this attack's block settings."""
        mod = server.model.modification
        fix = (
            "the capture must be made on the imprinted model (the pipeline's capture rule does "
            "this for a malicious attack: gradinv.attacks.malicious_server)"
        )
        if mod is None:
            raise ValueError(
                f"imprint: the capture was made on the honest model {server.model.name}; {fix}"
            )
        if mod["kind"] != "imprint":
            raise ValueError(f"imprint: the capture's model was changed by {mod['kind']!r}; {fix}")
        sent = from_mapping(type(self.settings), mod["settings"], where="the capture's imprint")
        differ = [
            f"{f}: sent {getattr(sent, f)!r}, attack {getattr(self.settings, f)!r}"
            for f in self.modification_fields
            if getattr(sent, f) != getattr(self.settings, f)
        ]
        if differ:
            raise ValueError(
                f"imprint: the capture's block differs from this attack's ({'; '.join(differ)}); "
                "run the attack with the settings the malicious server used"
            )

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        began = time.perf_counter()
        s, meta = self.settings, update.meta
        self.transform_note = self.eot_note = "off"
        self.label_note, self.speed = "", {}
        if s.transform_aware != "off" or s.eot_samples > 0:
            raise ValueError(
                "imprint is analytic: it compares no dummy gradient, so transform_aware and "
                "eot_samples do not apply; leave them off"
            )
        self.check_capture(server)
        model = self.server_model(server, device)
        named = {n for n, _ in self.matched_parameters(model, meta.image_shape)}
        if not {WEIGHT, BIAS} <= named:
            raise ValueError(
                f"imprint reads the gradients of {WEIGHT} and {BIAS}, which layers "
                f"{list(s.layers)} less ignore_layers {list(s.ignore_layers)} leave out"
            )
        self.matched_names = [WEIGHT, BIAS]
        missing = [n for n in self.matched_names if n not in update.tensors]
        if missing:
            raise ValueError(
                f"the shared update lacks {missing}; was it captured on another model?"
            )
        sign = -1.0 if update.kind == "delta" else 1.0  # a delta is a step against the gradient
        grad_w = sign * update.tensors[WEIGHT].to(device, torch.float64)
        grad_b = sign * update.tensors[BIAS].to(device, torch.float64)
        if not (torch.isfinite(grad_w).all() and torch.isfinite(grad_b).all()):
            raise AttackFailed("the imprint block's shared gradient is not finite")
        labels = self.private_labels(model, update)

        # bins by ascending edge (the server's own biases are minus the edges)
        order = torch.argsort(-server.state[BIAS].to(torch.float64)).to(device)
        w, b = grad_w[order], grad_b[order]
        dw = w - torch.cat([w[1:], torch.zeros_like(w[:1])])
        db = b - torch.cat([b[1:], torch.zeros_like(b[:1])])
        floor = SIGNAL * float(b.abs().max())
        carrying = db.abs() > floor
        picked = torch.argsort(db.abs(), descending=True, stable=True)[: meta.batch_size]
        picked = picked[carrying[picked]].sort().values  # returned in the order of the bins

        flat = torch.zeros((meta.batch_size, dw.shape[1]), dtype=torch.float64, device=device)
        flat[: len(picked)] = dw[picked] / db[picked, None]
        images = denormalize(flat.reshape(meta.batch_size, *meta.image_shape), meta.mean, meta.std)
        images[len(picked) :] = GREY
        images = images.clamp(0, 1).float().cpu()

        seconds = time.perf_counter() - began
        self.speed = {
            "iterations": 1,
            "seconds": round(seconds, 6),
            "per_second": 1 / max(seconds, 1e-9),
        }
        return AttackResult(
            images=images,
            labels=labels.cpu(),
            history={"bias_difference": [(i, float(v)) for i, v in enumerate(db.tolist())]},
            summary={
                "server": self.describe(server.model),
                "recovered": len(picked),
                "bins_with_signal": int(carrying.sum()),
                "recovered_bins": picked.tolist(),
                "batch_size": meta.batch_size,
                "bins": s.bins,
            },
        )
