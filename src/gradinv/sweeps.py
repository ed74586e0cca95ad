"""Sweeps: one defense block per value of one setting (``sweeps:`` in params.yaml).

A sweep's point is its base block with the setting changed, named ``<defense>-<setting><value>``
and labelled with the value; a table's ``sweeps`` appends its points to its defenses
(:func:`expand_sweeps`, part of validation). A point at the base's own value is the base: it
reads the base's runs (:func:`shared_runs`, :func:`table_runs`), so one setting runs once.
"""

from __future__ import annotations

import copy
import difflib
from typing import Any

from gradinv.settings import ConfigError


def _value_text(value: Any) -> str:
    """A swept value as the variant's name and label show it: 0.001, 1000, true."""
    if isinstance(value, bool):
        return str(value).lower()
    return format(value, "g") if isinstance(value, float) else str(value)


def sweep_variant(defense: str, setting: str, value: Any) -> str:
    """The run key of ``defense`` with ``setting`` at ``value``: ``noise-std0.001``."""
    return f"{defense}-{setting}{_value_text(value)}"


def sweep_points(config: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
    """Every defense variant a sweep made, by run key: (base defense, setting, value)."""
    return {
        sweep_variant(s["defense"], s["setting"], v): (s["defense"], s["setting"], v)
        for s in config.get("sweeps", {}).values()
        for v in s["values"]
    }


def shared_runs(config: dict[str, Any]) -> dict[str, str]:
    """The sweep points that are their base defense, by run key: a point whose value is the
    base's own (``noise-std0.01`` where ``noise`` has std 0.01) reads the base's runs, so one
    setting runs once and every table shows the same numbers for it (Refiner's Tables 5-8 share
    their default row). A defense defined under its own name always runs under it."""
    defenses = config["defenses"]
    shared = {
        variant: base
        for variant, (base, setting, value) in sweep_points(config).items()
        if defenses[base].get(setting) == value
    }
    for variant, base in shared.items():  # a sweep of a sweep's point: back to the first base
        while base in shared:
            base = shared[base]
        shared[variant] = base
    return shared


def table_runs(config: dict[str, Any], table: str) -> list[str]:
    """The defenses whose runs table ``table`` reads: its defenses, a shared sweep point
    replaced by its base (:func:`shared_runs`), each once, in the table's order."""
    shared = shared_runs(config)
    return list(dict.fromkeys(shared.get(d, d) for d in config["tables"][table]["defenses"]))


def expand_sweeps(config: dict[str, Any], source: str) -> None:
    """Add a defense block for each value of each sweep (``sweeps:``), and each table's swept
    variants (its ``sweeps:``) to its defenses, in place: everything downstream sees ordinary
    defenses. A variant is its base block with the one setting changed, labelled with it."""
    sweeps, defenses = config.get("sweeps") or {}, config.get("defenses")
    if not isinstance(sweeps, dict) or not isinstance(defenses, dict):
        return  # the schema names the problem
    for name, sweep in sweeps.items():
        if not isinstance(sweep, dict) or not {"defense", "setting", "values"} <= set(sweep):
            continue  # the schema names the missing key
        base, setting = sweep["defense"], sweep["setting"]
        if base not in defenses:
            close = difflib.get_close_matches(str(base), defenses, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: sweeps.{name}.defense: {base!r} is not defined.{hint}")
        if not isinstance(defenses[base], dict) or setting not in defenses[base]:
            continue  # named by check_references, after the schema has named any typo in base
        for value in sweep["values"]:
            key = sweep_variant(base, setting, value)
            block = copy.deepcopy(defenses[base])
            block[setting] = copy.deepcopy(value)
            block["label"] = f"{defenses[base].get('label', base)} {setting}={_value_text(value)}"
            if key in defenses and defenses[key] != block:
                raise ConfigError(
                    f"{source}: sweeps.{name}: the variant {key!r} is also defined under "
                    "defenses with other settings; rename that block."
                )
            defenses[key] = block
    for table, spec in (config.get("tables") or {}).items():
        names = spec.get("sweeps", []) if isinstance(spec, dict) else []
        for name in names:
            if name not in sweeps:
                close = difflib.get_close_matches(str(name), sweeps, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"{source}: tables.{table}.sweeps: {name!r} is not defined under sweeps.{hint}"
                )
        if names:
            swept = [
                sweep_variant(sweeps[n]["defense"], sweeps[n]["setting"], v)
                for n in names
                for v in sweeps[n]["values"]
            ]
            spec["defenses"] = list(dict.fromkeys([*spec.get("defenses", []), *swept]))
