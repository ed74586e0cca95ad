"""The defense interface: (model, private batch, loss) -> shared update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from gradinv.models import auxiliary_loss
from gradinv.protocol import ModelSpec

Gradients = dict[str, Tensor]
LossFn = Callable[[Tensor, Tensor], Tensor]


def gradients_of(
    model: nn.Module, inputs: Tensor, labels: Tensor, loss_fn: LossFn, create_graph: bool = False
) -> Gradients:
    """The gradient of ``loss_fn(model(inputs), labels)``, plus the model's own term (a
    variational bottleneck's KL, :func:`gradinv.models.auxiliary_loss`), for every trainable
    parameter, by name."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = training_loss(model, inputs, labels, loss_fn)
    grads = torch.autograd.grad(loss, [p for _, p in named], create_graph=create_graph)
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


def training_loss(model: nn.Module, inputs: Tensor, labels: Tensor, loss_fn: LossFn) -> Tensor:
    """The client's loss on a batch: the task loss plus the model's auxiliary term, if any."""
    loss = loss_fn(model(inputs), labels)
    aux = auxiliary_loss(model)
    return loss if aux is None else loss + aux


def gradient_cosine(a: Gradients, b: Gradients) -> float:
    """Cosine between two gradients over all of ``b``'s layers, flattened together."""
    dot = sum((a[n] * b[n]).sum() for n in b)
    na = torch.sqrt(sum(a[n].pow(2).sum() for n in b))
    nb = torch.sqrt(sum(b[n].pow(2).sum() for n in b))
    return float(dot / (na * nb)) if na > 0 and nb > 0 else 0.0


class Defense:
    """Base class. Subclasses define a frozen ``Settings`` dataclass and override one hook.

    ``transform`` receives the undefended gradient and returns the shared one; defenses that need
    the model or the batch again (CENSOR evaluates candidate updates, Soteria inspects features)
    override ``shared_update`` instead.
    """

    Settings: ClassVar[type]
    # True for a defense whose transform is random (noise, CENSOR): the EOT attack then averages
    # over samples of it (attacker_samples); a deterministic one is matched by attacker_transform.
    randomized: ClassVar[bool] = False
    # True for a defense that changes the model (wrap_model) rather than, or besides, the update.
    architectural: ClassVar[bool] = False
    update_lr: float | None = None  # the client's step size, set by build_defense
    # Public (non-private) images and labels, as model inputs, for defenses that draw directions
    # from them (CENSOR's source: public); set by build_defense.
    public: tuple[Tensor, Tensor] | None = None

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def wrap_model(self, model: nn.Module, spec: ModelSpec) -> nn.Module:
        """Architectural defenses (``architectural = True``) extend the model ``spec`` describes
        here; :func:`gradinv.models.build_model` calls it for a spec whose ``extension`` names
        the defense, so the server trains, and the attacker receives, the extended model."""
        return model

    def shared_update(
        self,
        model: nn.Module,
        inputs: Tensor,
        labels: Tensor,
        loss_fn: LossFn,
        generator: torch.Generator,
    ) -> Gradients:
        grads = gradients_of(model, inputs, labels, loss_fn)
        return self.transform(grads, generator)

    def attacker_transform(
        self, observed: Gradients, mode: Literal["configured", "estimated"]
    ) -> Callable[[Gradients], Gradients] | None:
        """The defense's deterministic transform, as an attacker applies it to a dummy gradient.

        ``configured``: with the defense's own settings; ``estimated``: with what the observed
        (shared) update reveals, such as its norm or its zeros. None when there is nothing
        deterministic to apply (no defense, noise, CENSOR: those call for EOT, not this). Used by
        the transform-aware attacks (``transform_aware`` in every attack's settings); the result
        must stay differentiable in the dummy gradient.
        """
        return None

    def attacker_samples(self, grads: Gradients, n: int, generator: torch.Generator) -> Gradients:
        """n draws of the defense's random transformation of ``grads``, per layer (n, *shape).

        What an EOT attacker (Athalye et al. 2018) averages over: the defense as configured (the
        server knows what its clients run), applied to the attacker's dummy gradient. It must stay
        differentiable in ``grads`` and draw from ``generator`` (on the CPU, then moved), so that a
        seed fixes the samples. Only defenses with ``randomized = True`` implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} is not randomized: nothing to sample")

    def transform(self, grads: Gradients, generator: torch.Generator) -> Gradients:
        """The shared gradients. ``generator`` is a CPU generator: draw random numbers on the CPU
        and move them to the gradients' device, so a seed gives the same draws on any device."""
        raise NotImplementedError
