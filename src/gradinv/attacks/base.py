"""The attack interface and the threat model every attack honours and records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from gradinv.models import build_model
from gradinv.progress import Progress
from gradinv.protocol import ServerMessage, SharedUpdate

CPU = torch.device("cpu")


class AttackFailed(RuntimeError):
    """The attack could not produce a reconstruction (for example a non-finite loss)."""


@dataclass(frozen=True)
class ThreatModel:
    """What the attacker knows beyond the shared update. Recorded with every result.

    ``labels``: ``known`` (the server is given the private labels, a stronger attacker) or
    ``infer`` (read from the last-layer gradient by ``label_rule``: ``idlg``, Zhao et al. 2020,
    for one image; ``yin``, the row rule of Yin et al. 2021, for a batch; ``auto`` picks by size).
    ``model_mode``: whether the victim computed its update with the model in eval or train mode.
    ``bn_statistics``: whether the victim's batch-norm statistics are available (CENSOR: no).
    """

    labels: Literal["infer", "known"] = "infer"
    label_rule: Literal["auto", "idlg", "yin"] = "auto"
    model_mode: Literal["eval", "train"] = "eval"
    bn_statistics: bool = False


@dataclass
class AttackResult:
    images: Tensor  # (B, C, H, W) in [0, 1]
    labels: Tensor  # the labels the attack used (inferred or given)
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


class Attack:
    """An attack: ``Settings`` (a frozen dataclass) and :meth:`reconstruct`.

    ``reconstruct`` runs on ``device``; a long attack accepts a ``progress``
    (:class:`gradinv.progress.Progress`), saves its loop state when ``progress.due()`` and resumes
    from ``progress.load()``, so an interrupted job continues with the same result.
    """

    Settings: ClassVar[type]

    def __init__(self, settings: Any, threat: ThreatModel) -> None:
        self.settings = settings
        self.threat = threat

    def reconstruct(
        self,
        server: ServerMessage,
        update: SharedUpdate,
        generator: torch.Generator,
        *,
        device: torch.device = CPU,
        progress: Progress | None = None,
    ) -> AttackResult:
        raise NotImplementedError

    def server_model(self, server: ServerMessage, device: torch.device = CPU) -> nn.Module:
        """The attacker's copy of the global model on ``device``, in the victim's mode."""
        model = build_model(server.model)
        model.load_state_dict(server.state)
        model.to(device)
        model.train(self.threat.model_mode == "train")
        for p in model.parameters():
            p.requires_grad_(True)
        return model
