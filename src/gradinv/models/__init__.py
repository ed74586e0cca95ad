"""Model architectures, registered by name; see README.md to add one.

Every builder takes ``(num_classes, in_channels, image_size, settings)`` and returns a freshly
initialised ``nn.Module``; :func:`build_model` seeds the initialisation so that round 0 of every
experiment is the same model for every defense.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
    """Build the architecture of ``spec``, with its extension (an architectural defense) and its
    modification (a malicious server's) if it has them; with ``seed``, its initial weights are
    reproducible."""
    if seed is None:
        return _build(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _build(spec)


def _build(spec: ModelSpec) -> nn.Module:
    entry = MODELS.get(spec.name)
    settings = from_mapping(entry.Settings, spec.settings, where=f"models.{spec.name}")
    model = entry.build(spec.num_classes, spec.in_channels, spec.image_size, settings)
    if spec.extension is not None:
        from gradinv.defenses import build_defense  # defenses sit above models: import on use

        kind = spec.extension["kind"]
        where = f"the model's extension {kind}"
        model = build_defense(kind, spec.extension["settings"], where=where).wrap_model(model, spec)
    if spec.modification is not None:
        from gradinv.attacks import ATTACKS, ThreatModel, build_attack  # attacks sit above too

        kind = spec.modification["kind"]
        if ATTACKS.get(kind).server != "malicious":
            raise ValueError(f"the model's modification names {kind}, not a malicious attack")
        where = f"the model's modification {kind}"
        attack = build_attack(kind, spec.modification["settings"], ThreatModel(), where=where)
        model = attack.malicious_model(model, spec)
    return model


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


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """Restore ``model``'s buffers (batch-norm running statistics) on exit: for forward passes
    that are no training step (the server's look at a client's batch, a defense's search)."""
    saved = {n: b.clone() for n, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])


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
