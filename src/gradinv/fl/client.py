"""One client's contribution to a round.

FedSGD (CENSOR's Algorithm 1): the client shares its defended gradient on one batch. FedAvg
(McMahan et al. 2017): the client takes ``local_steps`` SGD steps, each with a defended gradient,
and shares the model delta. The defense is applied at every gradient computation, so a defense
that selects or perturbs gradients (CENSOR, noise) behaves the same under both protocols.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gradinv.defenses import Defense, Gradients


def client_update(
    model: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    defense: Defense,
    *,
    protocol: Literal["fedsgd", "fedavg"],
    local_steps: int,
    local_lr: float,
    generator: torch.Generator,
) -> tuple[Gradients, nn.Module]:
    """The shared update and the client's model afterwards (for its batch-norm buffers).

    ``model`` is not modified; the client works on its own copy, as a real client would.
    """
    local = copy.deepcopy(model)
    if protocol == "fedsgd":
        grads = defense.shared_update(local, inputs, labels, F.cross_entropy, generator)
        return {n: g.detach() for n, g in grads.items()}, local
    start = {n: p.detach().clone() for n, p in local.named_parameters()}
    for _ in range(local_steps):
        grads = defense.shared_update(local, inputs, labels, F.cross_entropy, generator)
        with torch.no_grad():
            for n, p in local.named_parameters():
                if n in grads:
                    p -= local_lr * grads[n]
    delta = {n: (p.detach() - start[n]) for n, p in local.named_parameters() if p.requires_grad}
    return delta, local
