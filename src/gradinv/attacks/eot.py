"""Expectation over Transformation (EOT): the adaptive attack against a randomized defense.

EOT (Athalye et al. 2018, arXiv:1707.07397) attacks a randomized defense by optimising the
expectation of the attack objective over the defense's random transformation, estimated from a
few samples, instead of ignoring the randomness. CENSOR (Zhang et al., NDSS 2025, Section V-D)
pairs GIFD with EOT: "the attacker follows the sampling methodology used by Censor's defense
algorithm, generating orthogonal gradients and subsequently normalizing them in the same manner.
After that, the attacker computes the average of the collected gradients over the number of
trials", and "refine[s] the averaging process to prioritize gradients that are more informative
or indicative of the original data". Table III reports that it does not weaken CENSOR.

Every attack has it (``eot_samples`` > 0 in :class:`~gradinv.attacks.base.MatchSettings`). The
attacker knows which defense the client ran and how it is configured (the server sets up its
clients); at every iteration it takes its dummy gradient g (differentiable in the dummy images)
and draws n samples of the defense's transformation of it
(:meth:`gradinv.defenses.Defense.attacker_samples`: CENSOR's orthogonal, norm-matched directions
with its projection and scope; Gaussian noise's g + σ·N(0, I)). ``combine`` says how the n samples
make one loss, with the attack's own distance:

- ``average-gradient``: CENSOR's text; average the n transformed dummy gradients, then take the
  distance of that average.
- ``average-loss``: classic EOT; the mean of the n distances.
- ``best-sample``: the lowest of the n distances. CENSOR does not define how the attacker
  "prioritizes gradients that are more informative"; keeping the sample closest to the shared
  update is our reading of it, not the paper's definition.

The samples come from the attack's generator, so a seed fixes them and a resumed run draws the
same ones. Against a deterministic defense EOT has nothing to sample: the attack runs as without
it, and its result says so (``transform_aware`` is the adaptive attack there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from torch import Tensor

Combine = Literal["average-gradient", "average-loss", "best-sample"]
# Stacked gradients (per layer (n, *shape)) and the target -> the n distances, shape (n,).
Distances = Callable[[list[Tensor], list[Tensor]], Tensor]


def eot_distance(
    samples: list[Tensor], target: list[Tensor], distances: Distances, combine: Combine
) -> Tensor:
    """One EOT loss from n samples of the transformed dummy gradient (per layer (n, *shape))."""
    if combine == "average-gradient":
        return distances([s.mean(0, keepdim=True) for s in samples], target)[0]
    losses = distances(samples, target)
    if combine == "average-loss":
        return losses.mean()
    return losses.min()
