"""Frozen settings dataclasses, filled from ``params.yaml`` and turned into JSON schema.

Each method keeps its settings in a frozen dataclass beside its code. Bounds live in the field's
metadata (``bounded(0.0, ge=0)``), so one declaration gives the default, the type, the check and
the schema that ``params.yaml`` is validated against. An unknown key is an error, never ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, TypeVar

S = TypeVar("S")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and the fix."""


def bounded(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    min_items: int | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with numeric bounds that the schema and the loader both enforce; for a
    tuple, the bounds hold for each item and ``min_items`` bounds its length."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt).items() if v is not None}
    if min_items is not None:
        meta["min_items"] = min_items
    if doc:
        meta["doc"] = doc
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple for sequence defaults: settings are frozen")
    return dataclasses.field(default=default, metadata=meta)


def choice(default: str, *, renamed: dict[str, str] | None = None, doc: str = "") -> Any:
    """A field of ``Literal`` values; ``renamed`` maps values that were renamed to their new
    names, so that an old config is refused with the new name instead of a bare "not one of"."""
    meta: dict[str, Any] = {"renamed": dict(renamed)} if renamed else {}
    if doc:
        meta["doc"] = doc
    return dataclasses.field(default=default, metadata=meta)


def renamed_value(field: dataclasses.Field, value: Any, where: str) -> str | None:
    """The error for a value ``field`` no longer takes (see :func:`choice`), or None."""
    new = field.metadata.get("renamed", {}).get(value) if isinstance(value, str) else None
    if new is None:
        return None
    return (
        f"{where}: {value!r} was renamed; use {new!r} (see the {field.name} setting's "
        "documentation for what each value does)."
    )


_JSON_BOUND = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a) for a in typing.get_args(tp)]
        return {"anyOf": options}
    if origin is tuple:
        args = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(args[0])}
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    raise TypeError(f"no JSON schema for settings type {tp!r}")


def settings_schema(cls: type, extra_properties: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of a settings dataclass: every field optional, no other key allowed."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = dict(extra_properties or {})
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        bounds = prop["items"] if prop.get("type") == "array" else prop  # a tuple: each item
        for key, json_key in _JSON_BOUND.items():
            if key in f.metadata:
                bounds[json_key] = f.metadata[key]
        if "min_items" in f.metadata:
            prop["minItems"] = f.metadata["min_items"]
        if "doc" in f.metadata:
            prop["description"] = f.metadata["doc"]
        if "renamed" in f.metadata:  # read by gradinv.config's error messages, not a JSON keyword
            prop["x-renamed"] = f.metadata["renamed"]
        properties[f.name] = prop
    return {"type": "object", "properties": properties, "additionalProperties": False}


def from_mapping(cls: type[S], values: dict[str, Any] | None, where: str) -> S:
    """Build the settings dataclass ``cls`` from ``values``; ``where`` names the config key."""
    values = dict(values or {})
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(names))
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, names, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(names)}."
        raise ConfigError(f"{where}.{key}: unknown key; {fix}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for name, value in values.items():
        if isinstance(value, list):
            values[name] = tuple(value)
        if hints[name] is float and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
        if typing.get_origin(hints[name]) is Literal:
            allowed = typing.get_args(hints[name])
            if value not in allowed:
                message = renamed_value(fields[name], value, f"{where}.{name}")
                raise ConfigError(
                    message
                    or f"{where}.{name}: {value!r} is not one of {', '.join(map(str, allowed))}."
                )
    try:
        obj = cls(**values)
    except ConfigError as err:  # a combination its __post_init__ refuses
        raise ConfigError(f"{where}: {err}") from None
    check_bounds(obj, where)
    return obj


def check_bounds(obj: Any, where: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, tuple):
            if len(value) < f.metadata.get("min_items", 0):
                raise ConfigError(
                    f"{where}.{f.name}: list at least {f.metadata['min_items']} value(s)."
                )
            for i, item in enumerate(value):
                _check_number(item, f, f"{where}.{f.name}[{i}]")
        else:
            _check_number(value, f, f"{where}.{f.name}")


def _check_number(value: Any, f: dataclasses.Field, where: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok in (
            ("ge", value >= f.metadata.get("ge", value)),
            ("gt", "gt" not in f.metadata or value > f.metadata["gt"]),
            ("le", value <= f.metadata.get("le", value)),
            ("lt", "lt" not in f.metadata or value < f.metadata["lt"]),
        ):
            if not ok:
                word = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[key]
                raise ConfigError(
                    f"{where}: {value} is out of range; it must be {word} {f.metadata[key]}."
                )


def as_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)
