"""Gradient inversion attacks, registered by name; see README.md to add one.

An attack receives what the server holds, the :class:`ServerMessage` it sent and the
:class:`SharedUpdate` a client returned, and reconstructs the client's images. It never sees the
:class:`PrivateBatch`. Most attacks are an honest-but-curious server's; a malicious one (Imprint)
also changes the model it sends (:meth:`Attack.malicious_model`, :func:`malicious_server`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gradinv.attacks.base import Attack, AttackFailed, AttackResult, MatchSettings, ThreatModel
from gradinv.models import build_model
from gradinv.protocol import ServerMessage
from gradinv.registry import Registry
from gradinv.settings import from_mapping

ATTACKS: Registry[type[Attack]] = Registry("attack")

from gradinv.attacks import (  # noqa: E402, F401
    cpl,
    dlg,
    ggl,
    gias,
    gifd,
    gradinversion,
    idlg,
    imprint,
    inverting_gradients,
)


def build_attack(kind: str, settings: dict[str, Any], threat: ThreatModel, where: str) -> Attack:
    cls = ATTACKS.get(kind)
    return cls(from_mapping(cls.Settings, settings, where=where), threat)


def malicious_server(server: ServerMessage, kind: str, settings: dict[str, Any]) -> ServerMessage:
    """The message a malicious server running attack ``kind`` sends instead of ``server``: the
    same model and weights, changed by the attack (:meth:`Attack.malicious_model`), with the
    change recorded in the spec so that every reader rebuilds the same architecture."""
    spec = replace(server.model, modification={"kind": kind, "settings": dict(settings)})
    honest = build_model(server.model)
    honest.load_state_dict(server.state)
    attack = build_attack(kind, settings, ThreatModel(), where=f"the malicious server's {kind}")
    model = attack.malicious_model(honest, spec)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return ServerMessage(model=spec, state=state, round=server.round)


__all__ = [
    "ATTACKS",
    "Attack",
    "AttackFailed",
    "AttackResult",
    "MatchSettings",
    "ThreatModel",
    "build_attack",
    "malicious_server",
]
