"""Expectation over Transformation against CENSOR: the adaptive attack of CENSOR's Table III.

EOT (Athalye et al. 2018, arXiv:1707.07397) attacks a randomised defense by optimising the
expectation of the attack objective over the defense's random transformation, estimated from a
few samples, instead of ignoring the randomness. CENSOR (Zhang et al., NDSS 2025, Section V-D)
pairs GIFD with EOT: "the attacker follows the sampling methodology used by Censor's defense
algorithm, generating orthogonal gradients and subsequently normalizing them in the same manner.
After that, the attacker computes the average of the collected gradients over the number of
trials", and "refine[s] the averaging process to prioritize gradients that are more informative
or indicative of the original data". Table III reports that it does not weaken CENSOR.

Here the threat model is an attacker who knows the client ran CENSOR. At every iteration it
takes its dummy gradient g (built with ``create_graph=True``, so everything below stays
differentiable in the dummy images) and draws n CENSOR-style samples of it: for each layer l a
direction r ~ N(0, I), made orthogonal to g_l and rescaled to ‖g_l‖ by CENSOR's own
:func:`~gradinv.defenses.censor.orthogonal_direction`, with the defense's ``projection`` and
``scope``. It then compares these samples with the shared update; ``combine`` says how the n
samples make one loss:

- ``average-gradient``: the paper's text; average the n transformed dummy gradients, then take
  the matching loss of that average.
- ``average-loss``: classic EOT; the mean of the n matching losses.
- ``best-sample``: the lowest of the n matching losses. The paper does not define how the
  attacker "prioritizes gradients that are more informative"; keeping the sample closest to
  the shared update is our reading of it, not the paper's definition.

CENSOR then keeps, of its T candidates, the one whose step lowers the loss on the client's
private batch; the attacker does not have that batch, and these samples skip the selection.

The n directions of a layer come from one ``randn`` call on the CPU generator (then moved to the
device, as the defenses draw), so a seed gives the same samples on any device.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.func import vmap

from gradinv.attacks.matching import cosine_distance, cosine_distances
from gradinv.defenses.censor import orthogonal_direction

Combine = Literal["average-gradient", "average-loss", "best-sample"]
Projection = Literal["exact", "as-coded"]
Scope = Literal["layer-wise", "whole-model"]


def censor_samples(
    grads: list[Tensor],
    n: int,
    generator: torch.Generator,
    projection: Projection = "exact",
    scope: Scope = "layer-wise",
) -> list[Tensor]:
    """n CENSOR-style transforms of ``grads``: per layer, a tensor of shape (n, *g.shape)."""
    if scope == "layer-wise":
        return [_orthogonal(g, n, generator, projection) for g in grads]
    flat = torch.cat([g.reshape(-1) for g in grads])
    out = _orthogonal(flat, n, generator, projection)
    pieces = out.split([g.numel() for g in grads], dim=1)
    return [p.reshape(n, *g.shape) for p, g in zip(pieces, grads, strict=True)]


def _orthogonal(g: Tensor, n: int, generator: torch.Generator, projection: Projection) -> Tensor:
    r = torch.randn((n, *g.shape), generator=generator, dtype=g.dtype).to(g.device)
    # orthogonal_direction reduces over its whole input: vmap applies it to each of the n draws
    # in one batched pass (measured a little faster than a loop on the CPU)
    return vmap(lambda ri: orthogonal_direction(g, ri, projection))(r)


def eot_distance(
    dummy: list[Tensor],
    target: list[Tensor],
    n: int,
    generator: torch.Generator,
    *,
    combine: Combine = "average-gradient",
    projection: Projection = "exact",
    scope: Scope = "layer-wise",
    nonzero_only: bool = False,
) -> Tensor:
    """The EOT matching loss of ``dummy`` against the shared ``target`` (see the module doc)."""
    samples = censor_samples(dummy, n, generator, projection, scope)
    if combine == "average-gradient":
        return cosine_distance([s.mean(0) for s in samples], target, nonzero_only)
    losses = cosine_distances(samples, target, nonzero_only)
    if combine == "average-loss":
        return losses.mean()
    return losses.min()
