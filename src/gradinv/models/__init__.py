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
