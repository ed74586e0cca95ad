"""Client-side defenses, registered by name; see README.md to add one.

A defense is a policy that turns a client's private batch into the update it shares. Most
defenses act on the gradient (:meth:`Defense.transform`); architectural ones also change the model
(:meth:`Defense.wrap_model`), and the attacker then receives the wrapped model.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from gradinv.defenses.base import Defense, Gradients, gradient_cosine, gradients_of
from gradinv.registry import Registry
from gradinv.settings import from_mapping

DEFENSES: Registry[type[Defense]] = Registry("defense")

from gradinv.defenses import (  # noqa: E402, F401
    censor,
    clipping,
    cvb,
    dcs2,
    dp_sgd,
    noise,
    none,
    precode,
    quantization,
    refiner,
    soteria,
    sparsification,
)


def defense_settings(kind: str, settings: dict[str, Any], where: str) -> Any:
    """The frozen settings of the defense registered as ``kind``, from its params.yaml block."""
    return from_mapping(DEFENSES.get(kind).Settings, settings, where=where)


def build_defense(
    kind: str,
    settings: dict[str, Any],
    where: str,
    update_lr: float | None = None,
    public: tuple[Tensor, Tensor] | None = None,
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    evaluation_network: nn.Module | None = None,
) -> Defense:
    """Instantiate the defense registered as ``kind`` with its settings from params.yaml.

    ``update_lr`` is the learning rate of the step the client's update will drive (``fl.lr``
    under FedSGD, ``fl.local_lr`` under FedAvg); defenses that look ahead (CENSOR) use it.
    ``public`` is a pool of public images and their labels, normalized as model inputs, for
    defenses that draw from public data (CENSOR with ``source: public``; ``uses_public``).
    ``normalization`` is the dataset's (mean, std), for defenses that work on images in [0, 1];
    ``evaluation_network`` is Refiner's noise-ratio predictor (``needs_evaluation_network``).
    """
    defense = DEFENSES.get(kind)(defense_settings(kind, settings, where))
    defense.update_lr = update_lr
    defense.public = public
    defense.normalization = normalization
    defense.evaluation_network = evaluation_network
    return defense


__all__ = [
    "DEFENSES",
    "Defense",
    "Gradients",
    "build_defense",
    "defense_settings",
    "gradient_cosine",
    "gradients_of",
]
