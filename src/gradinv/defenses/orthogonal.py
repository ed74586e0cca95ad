"""Orthogonal, norm-matched directions: CENSOR's ORTHOGONAL_GRAD and NORMALIZE_GRAD.

CENSOR (Zhang et al., NDSS 2025) shares a random direction r with its component in a subspace S
removed and its norm set to that of the gradient g it replaces. Which S is a choice the paper
makes twice, differently:

- Algorithm 1 (lines 24-36) and Eq. 12: S = span{g_l}, the batch gradient of one layer.
- Eq. 11: S = the span of the gradients of the k training instances of the client's batch
  (the introduction: "m - k linearly independent vectors orthogonal to the gradients of k
  training data instances"), obtained "through the Gram-Schmidt algorithm".

Both are :func:`orthogonal_direction` with another ``basis``. The basis is orthonormal
(:func:`orthonormal_basis`, a QR factorisation of the spanning vectors, each scaled to unit norm
first so that a small one is kept as accurately as a large one), and r is projected twice
("twice is enough": one pass of classical Gram-Schmidt in float32 leaves a component of about
the machine epsilon times ‖r‖/‖o‖ along S, the second removes it).

Where the complement of S is {0}, no such direction exists: a tensor with one element (a scalar
parameter: its only direction is g's), or fewer elements than S has dimensions. There, and in the
measure-zero case of an r inside S, the direction is zero: orthogonal to g, and norm-matched
wherever that is possible. A zero gradient gives zero too (its norm is 0). The result is never
NaN, and it stays differentiable in g and r (the EOT attack differentiates through it).

``as-coded`` is the official code's projection (``defense.py``): r scaled to unit norm, then
r - (r·g/‖g‖)·g, orthogonal only when ‖g‖ = 1 (it keeps a component of about (r·ĝ)(1 - ‖g‖)
along g). On a one-element tensor it shares ±g, as coded.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import vmap

# A remaining component smaller than this fraction of ‖r‖ is rounding, not a direction: about a
# hundred float32 epsilons (a Gaussian r in two dimensions falls this close to g with
# probability ~1e-5).
ZERO_TOLERANCE = 1e-5


def orthonormal_basis(vectors: Tensor) -> Tensor:
    """An orthonormal basis (n, q) of a subspace that contains every row of ``vectors`` (m, n).

    Rows are scaled to unit norm (zero rows dropped) before a reduced QR factorisation. With
    m >= n the basis is the whole space (q = n), and the complement is {0}.
    """
    norms = vectors.norm(dim=1, keepdim=True)
    rows = vectors[norms.squeeze(1) > 0] / norms[norms.squeeze(1) > 0]
    if len(rows) == 0:
        return vectors.new_zeros(vectors.shape[1], 0)
    return torch.linalg.qr(rows.T, mode="reduced").Q


def orthogonal_direction(
    g: Tensor, r: Tensor, projection: str = "exact", basis: Tensor | None = None
) -> Tensor:
    """``r`` with its component in S removed, rescaled to ‖g‖; zero where S's complement is {0}.

    S is span{g} (Eq. 12), or the span of ``basis`` for a tensor of n elements: (n, q)
    orthonormal columns (Eq. 11: the per-sample gradients, flattened), or (n,) one unit vector
    (ĝ, computed once for many draws). ``exact`` projects; ``as-coded`` follows the official
    code (see the module docstring) and takes no basis.
    """
    norm = g.norm()
    if norm == 0:
        return torch.zeros_like(g)
    if projection == "exact":
        q = (g / norm).reshape(-1) if basis is None else basis
        flat = r.reshape(-1)
        for _ in range(2):  # twice is enough
            flat = flat - (q * (q @ flat) if q.ndim == 1 else q @ (q.T @ flat))
        o = flat.view_as(r)
    else:
        if basis is not None:
            raise ValueError("the as-coded projection removes g alone: it takes no basis")
        r = r / r.norm()
        o = r - (r * g).sum() / norm * g
    size = o.norm()
    kept = size > ZERO_TOLERANCE * r.norm()
    # torch.where, not an if: the EOT attack maps this function over draws with vmap
    return o * torch.where(kept, norm / torch.where(kept, size, torch.ones_like(size)), 0.0)


def orthogonal_samples(
    g: Tensor,
    n: int,
    generator: torch.Generator,
    projection: str,
) -> Tensor:
    """n Gaussian directions (n, *g.shape) made orthogonal to ``g`` and norm-matched, drawn in
    one ``randn`` call on the CPU generator and moved to g's device (what an EOT attacker
    averages over)."""
    r = torch.randn((n, *g.shape), generator=generator, dtype=g.dtype).to(g.device)
    # orthogonal_direction reduces over its whole input: vmap applies it to each of the n draws
    # in one batched pass (measured a little faster than a loop on the CPU)
    return vmap(lambda ri: orthogonal_direction(g, ri, projection))(r)
