"""Model architectures, registered by name; see README.md to add one.

Every builder takes ``(num_classes, in_channels, image_size, settings)`` and returns a freshly
initialised ``nn.Module``; :func:`build_model` seeds the initialisation so that round 0 of every
experiment is the same model for every defense.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradinv.protocol import ModelSpec
from gradinv.registry import Registry
from gradinv.settings import from_mapping

MODELS: Registry[Any] = Registry("model")

# Registration happens on import; the list is explicit so that `ls` shows every model.
from gradinv.models import cnn, convnet, lenet, resnet, vit  # noqa: E402, F401


def build_model(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Build the architecture of ``spec``, with its extension (an architectural defense) if it
    has one; with ``seed``, its initial weights are reproducible."""
    if seed is None:
        return _build(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _build(spec)


def _build(spec: ModelSpec) -> nn.Module:
    entry = MODELS.get(spec.name)
    settings = from_mapping(entry.Settings, spec.settings, where=f"models.{spec.name}")
    model = entry.build(spec.num_classes, spec.in_channels, spec.image_size, settings)
    if spec.extension is None:
        return model
    from gradinv.defenses import build_defense  # defenses sit above models: import on use

    kind = spec.extension["kind"]
    defense = build_defense(kind, spec.extension["settings"], where=f"the model's extension {kind}")
    return defense.wrap_model(model, spec)


def feature_shape(model: nn.Module, spec: ModelSpec, module: str) -> tuple[int, ...]:
    """The shape of one sample's output of ``model``'s submodule ``module`` (its name in
    ``named_modules``), from a forward pass of a blank image without gradients, in eval mode
    (batch-norm statistics do not move)."""
    modules = dict(model.named_modules())
    if module not in modules:
        names = ", ".join(n for n in modules if n)
        raise ValueError(f"{spec.name} has no module {module!r}; its modules are: {names}")
    seen: list[torch.Size] = []
    hook = modules[module].register_forward_hook(lambda _m, _a, out: seen.append(out.shape))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, spec.in_channels, spec.image_size, spec.image_size))
    finally:
        hook.remove()
        model.train(was_training)
    return tuple(seen[0][1:])


def auxiliary_loss(model: nn.Module) -> torch.Tensor | None:
    """The term a model adds to its training loss in its last forward pass, or None.

    A variational bottleneck (PRECODE, CVB) stores its weighted KL divergence as ``aux_loss``
    during its forward; the client's loss, and the attacker's dummy loss (it knows the
    architecture), are the task loss plus this term. Reading it clears it, so a term is added
    once and no stale tensor (say, one made under ``vmap``) outlives the pass that made it.
    """
    terms = []
    for m in model.modules():
        term = getattr(m, "aux_loss", None)
        if term is not None:
            terms.append(term)
            m.aux_loss = None
    return sum(terms[1:], terms[0]) if terms else None


def classifier_layer(model: nn.Module) -> tuple[str, nn.Linear]:
    """The last fully connected layer (label inference and Soteria read its gradient)."""
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = (name, module)
    if last is None:
        raise ValueError(f"{type(model).__name__} has no fully connected layer")
    return last


def stochastic_parameters(model: nn.Module, image_shape: tuple[int, ...]) -> set[str]:
    """The parameters downstream of a random draw in the forward pass: those of every layer whose
    input differs between two forward passes of the same images under different random seeds.

    For a variational bottleneck (PRECODE, CVB) these are its decoder and every later layer, the
    gradients the CVB paper's "Ignore" attack leaves out; a deterministic model has none. Only
    the inputs of modules that own parameters are compared: a draw inside a module that also
    owns the weights after it is not seen. The
    probe runs on a copy of ``model`` in its current mode, so batch-norm statistics and the global
    random state are untouched.
    """
    import copy

    probe = copy.deepcopy(model)
    owners = [
        (name, m)
        for name, m in probe.named_modules()
        if next(m.parameters(recurse=False), None) is not None
    ]
    param = next(probe.parameters())
    images = torch.rand((2, *image_shape), generator=torch.Generator().manual_seed(0))
    images = images.to(device=param.device, dtype=param.dtype)

    def inputs_under(seed: int) -> dict[str, list[torch.Tensor]]:
        seen: dict[str, list[torch.Tensor]] = {}
        hooks = [
            m.register_forward_pre_hook(
                lambda _m, args, name=name: seen.setdefault(name, []).extend(
                    a.detach().clone() for a in args if isinstance(a, torch.Tensor)
                )
            )
            for name, m in owners
        ]
        try:
            # manual_seed reseeds every CUDA generator too: restore them all afterwards
            cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(seed)
                with torch.no_grad():
                    probe(images)
        finally:
            for h in hooks:
                h.remove()
        return seen

    first, second = inputs_under(1), inputs_under(2)
    varying = {
        name
        for name in first
        if len(first[name]) != len(second.get(name, []))
        or any(not torch.equal(a, b) for a, b in zip(first[name], second[name], strict=True))
    }
    return {
        f"{name}.{p}" if name else p
        for name, m in owners
        if name in varying
        for p, _ in m.named_parameters(recurse=False)
    }
