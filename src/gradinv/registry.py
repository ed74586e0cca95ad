"""One registry per kind of component (datasets, models, defenses, attacks), filled by a decorator.

Modelled on timm's registry: ``@DEFENSES.register("gaussian_noise")`` next to the implementation,
``DEFENSES.get(name)`` wherever it is used. A duplicate name, or an unknown one, is an error that
lists the close matches, so a typo in ``params.yaml`` names its own fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown or duplicate name in a registry."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0])


class Registry(Generic[T]):
    """A name -> object table for one kind of component."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that files the decorated class or function under ``name``."""

        def add(obj: T) -> T:
            if name in self._entries:
                raise RegistryError(
                    f"{self.kind} {name!r} is registered twice "
                    f"({self._entries[name]!r} and {obj!r}); rename one of them."
                )
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(self.available())}."
            ) from None

    def available(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.available())

    def __len__(self) -> int:
        return len(self._entries)
