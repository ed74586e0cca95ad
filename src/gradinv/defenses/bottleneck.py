"""What PRECODE and CVB share: a variational bottleneck inserted into a model.

A bottleneck encodes features h into a Gaussian N(mu, sigma^2), draws z = mu + sigma * eps
(the reparameterization trick, Kingma and Welling 2014) and decodes z back to h's shape, so it
fits anywhere. The draw happens in every forward pass, in train and eval mode alike, as in the
PRECODE and CVB code: the gradient a client shares is taken through a random draw, which is the
defense. The model's training loss gains beta * KL(N(mu, sigma^2) || N(0, 1)), stored as
``aux_loss`` during the forward (:func:`gradinv.models.auxiliary_loss` adds it, for the client
and for the attacker alike).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from gradinv.defenses.base import Defense, Gradients, LossFn, gradients_of

KLForm = Literal["std", "log_variance"]


def gaussian_kl(mu: Tensor, sigma: Tensor, form: KLForm, dims: tuple[int, ...]) -> Tensor:
    """KL(N(mu, s^2) || N(0, 1)) per sample, summed over ``dims``.

    ``std``: sigma is the standard deviation, -1/2 (1 + log sigma^2 - mu^2 - sigma^2) (the
    papers' Eq. 3). ``log_variance``: sigma is read as a log-variance, -1/2 (1 + sigma - mu^2 -
    exp sigma): the formula of the CVB code (taken from a VAE whose encoder outputs
    log-variances), applied there to the softplus output that the draw uses as the standard
    deviation.
    """
    if form == "std":
        terms = 1 + 2 * torch.log(sigma) - mu.pow(2) - sigma.pow(2)
    else:
        terms = 1 + sigma - mu.pow(2) - sigma.exp()
    return -0.5 * terms.sum(dims)


class VariationalBottleneck(nn.Module):
    """Base class: subclasses compute (mu, sigma) and decode; this draws and keeps the loss."""

    aux_loss: Tensor | None = None

    def __init__(self, beta: float) -> None:
        super().__init__()
        self.beta = beta

    def sample(self, mu: Tensor, sigma: Tensor, kl: Tensor) -> Tensor:
        """The reparameterized draw; ``kl`` (per sample) becomes the stored beta * mean KL."""
        self.aux_loss = self.beta * kl.mean()
        return mu + sigma * torch.randn_like(sigma)

    def __getstate__(self) -> dict[str, Any]:
        # A stored loss belongs to the pass that made it: copies start without it (a graph or a
        # vmap-batched tensor cannot be deep-copied).
        state = self.__dict__.copy()
        state["aux_loss"] = None
        return state


def insert_after(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """``model`` with its submodule ``name`` replaced by ``Sequential(original, module)``."""
    return _replace(model, name, lambda original: nn.Sequential(original, module))


def insert_before(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """``model`` with its submodule ``name`` replaced by ``Sequential(module, original)``."""
    return _replace(model, name, lambda original: nn.Sequential(module, original))


def _replace(model: nn.Module, name: str, wrap: Any) -> nn.Module:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, wrap(getattr(parent, child)))
    return model


BITS = math.log(2)  # PRECODE's code reports the KL in bits: nats / ln 2


class BottleneckDefense(Defense):
    """An architectural defense: the bottleneck in the model is the defense, and the client
    shares its gradient (task loss plus the KL term) as it is. The bottleneck's draws in the
    client's pass come from ``generator``, so a seed fixes the shared update."""

    architectural: ClassVar[bool] = True

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        seed = int(torch.randint(2**62, (1,), generator=generator))
        devices = [inputs.device.index or 0] if inputs.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return gradients_of(model, inputs, labels, loss_fn)

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        return grads
