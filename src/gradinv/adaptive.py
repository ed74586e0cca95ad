"""An adaptive attack against a defense it cannot adapt to is the attack it adapts: one run.

EOT (``eot_samples``) averages over samples of a randomized defense's transform, and the Ignore
attack (``ignore_layers: ["@stochastic"]``) leaves out the layers whose input a stochastic
bottleneck redraws (PRECODE, CVB). Against a defense that is not randomized EOT has nothing to
sample, and against one that adds no bottleneck the Ignore attack ignores nothing: the attack
then runs exactly as the attack it adapts, only with another seed (the attack stage decides so at
run time, from the same two properties of the defense). A table that lists both reads the plain
attack's runs for it (:func:`shared_attacks`), as a sweep point at its base's value reads its
base's (:func:`gradinv.sweeps.shared_runs`). So one attack runs once against each defense, and
the frontier, which takes the strongest of a table's attacks against each defense, does not take
the best of two or three seeds of IG against the defenses the adaptive attacks do not fit and of
fewer against those they do.
"""

from __future__ import annotations

from typing import Any

from gradinv.methods import fact


def randomized(defense: dict[str, Any]) -> bool:
    """Whether ``defense`` (a validated block) draws a new transform for every update: what EOT
    samples. A class attribute, or a property of the settings (GQ's stochastic rounding)."""
    declared = fact("defenses", defense["kind"], "randomized")
    if declared is not None:
        return bool(declared)
    from gradinv.config import method_settings
    from gradinv.defenses import DEFENSES  # a property of the settings: ask the defense
    from gradinv.settings import from_mapping

    cls = DEFENSES.get(defense["kind"])
    settings = from_mapping(cls.Settings, method_settings(defense), where=defense["label"])
    return bool(cls(settings).randomized)


def architectural(defense: dict[str, Any]) -> bool:
    """Whether ``defense`` adds layers to the model (PRECODE's and CVB's bottlenecks)."""
    return bool(fact("defenses", defense["kind"], "architectural"))


def as_run_against(attack: dict[str, Any], defense: dict[str, Any]) -> dict[str, Any]:
    """The settings ``attack`` (a validated block) runs with against ``defense``, its label aside:
    without EOT against a defense that is not randomized, without ``@stochastic`` against one
    that adds no layer; a setting that does nothing is left out, so equal runs compare equal."""
    from gradinv.methods import STOCHASTIC

    block = {k: v for k, v in attack.items() if k != "label"}
    if block.get("eot_samples") and not randomized(defense):
        block["eot_samples"] = 0
    if not block.get("eot_samples"):
        block.pop("eot_samples", None)
        block.pop("eot_combine", None)
    ignored = list(block.pop("ignore_layers", None) or [])
    if not architectural(defense):
        ignored = [p for p in ignored if p != STOCHASTIC]
    if ignored:
        block["ignore_layers"] = ignored
    return block


def shared_attacks(config: dict[str, Any], defense: str, attacks: list[str]) -> dict[str, str]:
    """The attacks of ``attacks`` that run against ``defense`` (a run key) as an earlier one of
    them does, each mapped to the first such attack, whose runs it reads."""
    block = config["defenses"][defense]
    runs: list[tuple[str, dict[str, Any]]] = []
    shared = {}
    for attack in attacks:
        settings = as_run_against(config["attacks"][attack], block)
        first = next((name for name, other in runs if other == settings), None)
        if first is None:
            runs.append((attack, settings))
        else:
            shared[attack] = first
    return shared


def attack_runs(config: dict[str, Any], defense: str, attacks: list[str]) -> list[str]:
    """The attacks whose runs a table of ``attacks`` reads against ``defense``: each once."""
    shared = shared_attacks(config, defense, attacks)
    return [a for a in attacks if a not in shared]
