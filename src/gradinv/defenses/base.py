"""The defense interface: (model, private batch, loss) -> shared update."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

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


def per_sample_gradients(
    model: nn.Module, inputs: Tensor, labels: Tensor, loss_fn: LossFn
) -> Gradients:
    """The gradient of each example alone (a batch of one), its model term included, stacked
    along a new first dimension, for every trainable parameter (DP-SGD clips them; DCS² compares
    them). It runs in the model's current mode; in train mode each example gets its own copy of
    the buffers, so batch-norm running statistics stay unchanged. The result stays
    differentiable in ``inputs`` (``torch.func`` composes with autograd)."""
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())
    buffer_dim = None
    if model.training and buffers:  # batch norm updates its running statistics in place
        buffers = {n: b.expand(len(labels), *b.shape).clone() for n, b in buffers.items()}
        buffer_dim = 0

    def loss_of(p: Gradients, b: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        loss = loss_fn(functional_call(model, {**p, **b}, (x[None],)), y[None])
        aux = auxiliary_loss(model)  # stored by this forward, under vmap: read it here
        return loss if aux is None else loss + aux

    per_example = vmap(grad(loss_of), in_dims=(None, buffer_dim, 0, 0), randomness="different")
    return per_example(params, buffers, inputs, labels)


def training_loss(model: nn.Module, inputs: Tensor, labels: Tensor, loss_fn: LossFn) -> Tensor:
    """The client's loss on a batch: the task loss plus the model's auxiliary term, if any."""
    loss = loss_fn(model(inputs), labels)
    aux = auxiliary_loss(model)
    return loss if aux is None else loss + aux


def gradient_cosine(a: Gradients, b: Gradients) -> float | None:
    """Cosine between two gradients over all of ``b``'s layers, flattened together; None where
    it is undefined: a zero gradient, or a non-finite entry in either (a statistic of a
    non-finite update would be a number about nothing)."""
    if not all(torch.isfinite(a[n]).all() and torch.isfinite(b[n]).all() for n in b):
        return None
    dot = sum((a[n].double() * b[n].double()).sum() for n in b)
    na = torch.sqrt(sum(a[n].double().pow(2).sum() for n in b))
    nb = torch.sqrt(sum(b[n].double().pow(2).sum() for n in b))
    return float(dot / (na * nb)) if na > 0 and nb > 0 else None


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
    # True for a defense that needs Refiner's evaluation network (the noise-ratio predictor,
    # gradinv.metrics.evaluation_network): the stages then load the dataset's network and pass it.
    needs_evaluation_network: ClassVar[bool] = False
    # The settings that say which samples of a batch the defense protects, for one that protects
    # some only (DCS²'s sensitive samples, gradinv.sensitive): every other defense of a table
    # with it is scored on the same samples (gradinv.table_inputs.scored_on). Empty: all of them.
    protects_samples_by: ClassVar[tuple[str, ...]] = ()
    update_lr: float | None = None  # the client's step size, set by build_defense
    # Public (non-private) images and labels, as model inputs, for defenses that draw directions
    # or start points from them (CENSOR's source: public); set by build_defense.
    public: tuple[Tensor, Tensor] | None = None
    # The dataset's per-channel mean and std: a defense receives normalized inputs, and one that
    # works on images in [0, 1] (Refiner, DCS²) converts with these; set by build_defense.
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # Refiner's evaluation network (images in [0, 1] -> predicted noise ratio), frozen; set by
    # build_defense for a defense with needs_evaluation_network.
    evaluation_network: nn.Module | None = None

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        # What the last shared_update did, on the client's side (the capture records it, the
        # attack never reads it). ``sensitive``: the indices of the batch's samples the defense
        # protects, where it protects some only (DCS²); the score stage then measures those.
        self.last: dict[str, Any] = {}

    @classmethod
    def uses_public(cls, settings: Any) -> bool:
        """Whether these settings need the public pool (``public``)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a client keeps between rounds (Refiner's robust data for its warm start); FL
        training saves it with its progress, so a resumed run continues bit for bit."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def rates(self, before: dict[str, Any]) -> dict[str, float]:
        """Per-round diagnostics from the defense's counters (``stats``) since they stood at
        ``before``, for the training history (CENSOR's fallback and raw-gradient rates); none
        by default."""
        return {}

    def shared_batch_size(self, labels: Tensor) -> int:
        """The number of samples the shared update is said to come from (public metadata): the
        batch's, or more for a defense that adds samples to it (DCS²'s concealed samples)."""
        return len(labels)

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
