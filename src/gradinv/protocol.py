"""The vocabulary of the threat model: what the server sends, what a client shares, what is secret.

An honest-but-curious server sees a :class:`ServerMessage` (it wrote it) and the
:class:`SharedUpdate` a client returns; the client's :class:`PrivateBatch` never leaves the client
and is used only to score an attack afterwards. Attacks take the first two and never the third;
defenses, the federated loop and the capture step all speak these types. The module sits at the
bottom of the import graph so that none of them needs another to talk.

Each type round-trips through plain dicts of tensors and numbers, the only things a capture file
holds (read back with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

UpdateKind = Literal["gradient", "delta"]


@dataclass(frozen=True)
class ModelSpec:
    """Enough to rebuild the architecture: the registry name and its settings.

    ``extension`` names an architectural defense that changed the model (PRECODE, CVB: a
    variational bottleneck inserted into it), as ``{"kind": ..., "settings": {...}}``: the server
    distributes the extended model, so the attacker knows the architecture and rebuilds it.
    ``modification`` names a malicious server's change to the model it sends (Imprint's block),
    as ``{"kind": <attack kind>, "settings": {...}}``; an honest server sends None.
    """

    name: str
    num_classes: int
    in_channels: int
    image_size: int
    settings: dict[str, Any] = field(default_factory=dict)
    extension: dict[str, Any] | None = None
    modification: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServerMessage:
    """The global model the server broadcasts at the start of a round."""

    model: ModelSpec
    state: dict[str, Tensor]
    round: int

    def to_dict(self) -> dict[str, Any]:
        return {"model": asdict(self.model), "state": self.state, "round": self.round}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerMessage:
        return cls(model=ModelSpec(**d["model"]), state=d["state"], round=int(d["round"]))


@dataclass(frozen=True)
class PublicMeta:
    """Metadata a client's update carries in the clear, or that the protocol makes public.

    ``labels`` is filled only when the threat model grants the attacker the labels; otherwise
    the attacker must infer them from the update.
    """

    dataset: str
    batch_size: int
    image_shape: tuple[int, int, int]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    model_mode: Literal["eval", "train"]
    defense: str
    defense_kind: str
    defense_settings: dict[str, Any]
    local_steps: int = 1
    local_lr: float = 0.0
    labels: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_shape"] = list(self.image_shape)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        d["labels"] = None if self.labels is None else list(self.labels)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PublicMeta:
        d = dict(d)
        d["image_shape"] = tuple(d["image_shape"])
        d["mean"], d["std"] = tuple(d["mean"]), tuple(d["std"])
        d["labels"] = None if d.get("labels") is None else tuple(d["labels"])
        return cls(**d)


@dataclass(frozen=True)
class SharedUpdate:
    """What a client sends back: its defended update, by parameter name, plus public metadata.

    For FedSGD the update is a gradient; for FedAvg it is the model delta (new - old).
    """

    tensors: dict[str, Tensor]
    kind: UpdateKind
    meta: PublicMeta

    def to_dict(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "kind": self.kind, "meta": self.meta.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SharedUpdate:
        return cls(tensors=d["tensors"], kind=d["kind"], meta=PublicMeta.from_dict(d["meta"]))


@dataclass(frozen=True)
class PrivateBatch:
    """A client's private data: images in [0, 1] (N, C, H, W) and integer labels (N,)."""

    images: Tensor
    labels: Tensor

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.labels.ndim != 1 or len(self.images) != len(self.labels):
            raise ValueError(
                f"a private batch needs images (N,C,H,W) and labels (N,); got "
                f"{tuple(self.images.shape)} and {tuple(self.labels.shape)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"images": self.images, "labels": self.labels}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrivateBatch:
        return cls(images=d["images"], labels=d["labels"])

    def normalized(self, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
        """The images as the model sees them."""
        return normalize(self.images, mean, std)


def normalize(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    m = torch.tensor(mean, dtype=images.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=images.dtype).view(1, -1, 1, 1)
    return (images - m) / s


def denormalize(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x * s + m
