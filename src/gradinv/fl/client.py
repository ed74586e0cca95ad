"""One client's contribution to a round.

FedSGD (CENSOR's Algorithm 1): the client shares its defended gradient on one batch. FedAvg
(McMahan et al. 2017): the client takes local steps, each with a defended gradient, and shares the
model delta. The defense is applied at every gradient computation, so a defense that selects or
perturbs gradients (CENSOR, noise) behaves the same under both protocols.

How a FedAvg client trains is each paper's code's own (``fl`` in params.yaml, a recipe's
overrides): ``local_steps`` steps on one batch (``local_epochs: 0``), or ``local_epochs`` passes
over its whole shard in batches (``batches``; CVB's and DCS²'s code), with plain SGD, SGD with
``momentum`` (DCS²'s code: 0.9) or Adam (``client_optimizer: adam``, CVB's code: 1e-3). A client
keeps its optimizer's state from one round it takes part in to the next, as those codes' clients
do: :func:`client_update` takes it and returns it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Literal

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
    client_optimizer: Literal["sgd", "adam"] = "sgd",
    momentum: float = 0.0,
    batches: Sequence[tuple[Tensor, Tensor]] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> tuple[Gradients, nn.Module, dict[str, Any] | None]:
    """The shared update, the client's model afterwards (for its batch-norm buffers) and, under
    FedAvg with an optimizer that has state (momentum, Adam), that state for the client's next
    round (None otherwise).

    ``model`` is not modified; the client works on its own copy, as a real client would. FedAvg
    takes ``local_steps`` steps on (``inputs``, ``labels``), or one step per batch of
    ``batches`` (its local epochs) when given.
    """
    local = copy.deepcopy(model)
    if protocol == "fedsgd":
        grads = defense.shared_update(local, inputs, labels, F.cross_entropy, generator)
        return {n: g.detach() for n, g in grads.items()}, local, None
    steps = list(batches) if batches is not None else [(inputs, labels)] * local_steps
    start = {n: p.detach().clone() for n, p in local.named_parameters()}
    optimizer = _optimizer(local, client_optimizer, local_lr, momentum)
    if optimizer is not None and optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
        for group in optimizer.param_groups:  # this round's rate (a decaying one moves on)
            group["lr"] = local_lr
    for x, y in steps:
        grads = defense.shared_update(local, x, y, F.cross_entropy, generator)
        if optimizer is None:  # plain SGD, written out: bit for bit the steps of before
            with torch.no_grad():
                for n, p in local.named_parameters():
                    if n in grads:
                        p -= local_lr * grads[n]
            continue
        for n, p in local.named_parameters():
            p.grad = grads[n].detach() if n in grads else None
        optimizer.step()
    delta = {n: (p.detach() - start[n]) for n, p in local.named_parameters() if p.requires_grad}
    return delta, local, None if optimizer is None else optimizer.state_dict()


def _optimizer(
    model: nn.Module, kind: str, lr: float, momentum: float
) -> torch.optim.Optimizer | None:
    """The client's optimizer; None for plain SGD without momentum (no state to keep)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if momentum:
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    return None
