"""Gradient inversion attacks, registered by name; see README.md to add one.

An attack receives what an honest-but-curious server holds, the :class:`ServerMessage` it sent and
the :class:`SharedUpdate` a client returned, and reconstructs the client's images. It never sees
the :class:`PrivateBatch`.
"""

from __future__ import annotations

from typing import Any

from gradinv.attacks.base import Attack, AttackFailed, AttackResult, MatchSettings, ThreatModel
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
    inverting_gradients,
)


def build_attack(kind: str, settings: dict[str, Any], threat: ThreatModel, where: str) -> Attack:
    cls = ATTACKS.get(kind)
    return cls(from_mapping(cls.Settings, settings, where=where), threat)


__all__ = [
    "ATTACKS",
    "Attack",
    "AttackFailed",
    "AttackResult",
    "MatchSettings",
    "ThreatModel",
    "build_attack",
]
