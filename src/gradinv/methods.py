"""What the workflow asks of each registered method, without importing the methods.

The registries (:mod:`gradinv.attacks`, ``defenses``, ``generators``, ``models``, ``data``)
import torch, which costs seconds, and Snakemake evaluates the whole workflow on every call
(``-n``, ``--lint``, ``--report``). What the workflow needs of a method there is its settings'
JSON schema (to validate params.yaml) and a few class-level facts (:data:`FACTS`: whether an
attack searches a generator, whether a defense needs the evaluation network, ...). Both are
generated from the registries into ``workflow/schemas/methods.json`` (``gradinv schema
--write``, after adding a method or changing its settings) and read here; ``tests/test_config.py``
fails, naming that command, when the stored copy differs from the registries.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gradinv.settings import ConfigError

PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "methods.json"

# The layer pattern of the "Ignore" attack (MatchSettings.ignore_layers): the layers after a
# random draw (PRECODE's and CVB's bottlenecks).
STOCHASTIC = "@stochastic"

# The class attributes the workflow reads, by registry: a value, or None where the method
# decides from its settings (then the method itself is asked: :func:`fact` returns None).
FACTS: dict[str, tuple[str, ...]] = {
    "attacks": ("generative", "server", "modification_fields"),
    "defenses": ("needs_evaluation_network", "randomized", "architectural", "protects_samples_by"),
    "generators": ("trainable",),
}


def generate() -> dict[str, Any]:
    """The settings schemas and facts of every registered method, from the registries (torch)."""
    import inspect

    from gradinv.config import methods_schema, registries

    regs = registries()
    facts: dict[str, dict[str, dict[str, Any]]] = {}
    for section, names in FACTS.items():
        facts[section] = {}
        for kind in regs[section].available():
            cls = regs[section].get(kind)
            facts[section][kind] = {
                name: (
                    None
                    if isinstance(inspect.getattr_static(cls, name, None), property)
                    else getattr(cls, name, False)  # a flag a class does not set: off
                )
                for name in names
            }
    return json.loads(json.dumps({"schemas": methods_schema(), "facts": facts}))


def write() -> Path:
    """Store :func:`generate` where :func:`stored` reads it."""
    from gradinv.io import write_text

    write_text(PATH, json.dumps(generate(), indent=1, sort_keys=True) + "\n")
    stored.cache_clear()
    return PATH


@functools.cache
def stored() -> dict[str, Any]:
    """The stored schemas and facts (``workflow/schemas/methods.json``)."""
    try:
        return json.loads(PATH.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"{PATH} is missing: regenerate it with `gradinv schema --write`"
        ) from None


def fact(section: str, kind: str, name: str) -> Any:
    """``name`` of the registered ``kind`` of ``section`` (``fact("attacks", "ggl",
    "generative")``); None where the method decides from its settings."""
    try:
        return stored()["facts"][section][kind][name]
    except KeyError:
        raise ConfigError(
            f"{section} kind {kind!r} has no stored {name!r} in {PATH}: a method added or changed "
            "since it was written; regenerate it with `gradinv schema --write`"
        ) from None
