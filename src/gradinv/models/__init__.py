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
from gradinv.models import cnn, convnet, lenet, resnet  # noqa: E402, F401


def build_model(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Build the architecture of ``spec``; with ``seed``, its initial weights are reproducible."""
    entry = MODELS.get(spec.name)
    settings = from_mapping(entry.Settings, spec.settings, where=f"models.{spec.name}")
    if seed is None:
        return entry.build(spec.num_classes, spec.in_channels, spec.image_size, settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return entry.build(spec.num_classes, spec.in_channels, spec.image_size, settings)


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
