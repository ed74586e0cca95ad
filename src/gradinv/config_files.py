"""Reading one configuration file: ``params.yaml`` or an overlay, as data and never as code.

Every configuration file goes through :func:`read_config_file`, whoever reads it: ``gradinv
validate`` and, through :mod:`gradinv.config_guard`, Snakemake's ``configfile:`` and
``--configfile``. A file is refused, with its path, line and column where they exist, when it

- is not valid YAML or JSON (JSON is YAML; a ``.json`` file is read as strict JSON),
- carries a tag that constructs a Python object (``!!python/...``) or any other non-data tag,
- says ``__use_yte__``: Snakemake would render it with YTE, which evaluates Python expressions,
- repeats a key in one mapping (YAML and JSON would keep the last one silently),
- is empty, or holds a list or a scalar instead of a mapping of ``params.yaml``'s keys,
- holds a NaN or an infinity (JSON's ``NaN``/``Infinity``; YAML's ``.nan``/``.inf`` are refused
  by the validation, with the key, since ``--config`` values never pass through here).

This module imports only the standard library, PyYAML and :mod:`gradinv.settings` (no torch): the
guard calls it in every Snakemake process before the Snakefile runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gradinv.settings import ConfigError

YTE_MARKER = "__use_yte__"


class ConfigFileError(ConfigError):
    """A configuration file that cannot be read as data; the message names file, place and fix."""


# PyYAML's safe loader, its C parser where built (5-10x faster; every dry run reads the schema,
# params.yaml and the claims)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_yaml(text: str) -> Any:
    """The plain values of YAML ``text``: PyYAML's safe loader, its C parser where built."""
    loader = SAFE_LOADER(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _StrictLoader(SAFE_LOADER):  # type: ignore[misc,valid-type]
    """PyYAML's safe loader (its C parser where built) that also refuses a key repeated in one
    mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                first = seen[key].start_mark
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice in one mapping (first on line "
                    f"{first.line + 1}); YAML keeps only the last, so delete one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_mapping)


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _yaml(path: Path, text: str) -> Any:
    loader = _StrictLoader(text)  # a safe loader: it builds plain values only
    try:
        return loader.get_single_data()
    except yaml.constructor.ConstructorError as err:
        problem = err.problem or str(err)
        if "could not determine a constructor for the tag" in problem:
            tag = problem.split("tag", 1)[1].strip(" '").replace("tag:yaml.org,2002:", "!!")
            problem = (
                f"the tag {tag} asks for a Python object or a non-data type; configuration "
                "files hold plain values (numbers, strings, lists, mappings): remove the tag"
            )
        raise ConfigFileError(f"{path}, {_where(err.problem_mark)}: {problem}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = " ".join(s for s in (err.context, err.problem) if s)
        raise ConfigFileError(
            f"{path}, {_where(mark)}: not valid YAML ({what}); check the indentation (spaces, "
            "no tabs) and quote values that contain ': ' or start with a special character"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigFileError(f"{path}: not valid YAML ({err})") from None
    finally:
        loader.dispose()


def _json(path: Path, text: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigFileError(
                    f"{path}: the key {key!r} appears twice in one object; JSON readers keep "
                    "only the last, so delete one of them"
                )
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ConfigFileError(
            f"{path}: {name} is not a number a setting can take; give a finite value"
        )

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as err:
        raise ConfigFileError(
            f"{path}, line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})"
        ) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in one configuration file, or :class:`ConfigFileError` saying why not."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigFileError(f"configuration file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigFileError(f"configuration file {path} cannot be read ({err})") from None
    layer = _json(path, text) if path.suffix.lower() == ".json" else _yaml(path, text)
    if layer is None:
        raise ConfigFileError(
            f"{path} is empty: a configuration file is a mapping of params.yaml's keys "
            "(for example `fl: {rounds: 10}`); delete the file or give it keys"
        )
    if not isinstance(layer, dict):
        raise ConfigFileError(
            f"{path} holds a {type(layer).__name__}, not a mapping of params.yaml's keys "
            "(for example `fl: {rounds: 10}`); a list or a single value cannot be merged"
        )
    if YTE_MARKER in layer:
        raise ConfigFileError(
            f"{path}: {YTE_MARKER} asks Snakemake to render the file with YTE, which evaluates "
            "Python expressions; gradinv reads configuration files as data only. Write the "
            "values out (or generate the file with a script you trust) and remove the key"
        )
    bad = [str(k) for k in layer if not isinstance(k, str)]
    if bad:
        raise ConfigFileError(
            f"{path}: top-level keys must be names, not {', '.join(bad)}; quote them"
        )
    return layer
