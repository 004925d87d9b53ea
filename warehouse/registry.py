"""A name → factory registry: policies, judges, PRM scorers (and later advantage estimators)
are looked up by the name a user types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``@registry.register("name")`` on a factory; ``registry.make("name", **options)``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable:
        def deco(factory):
            self.factories[name] = factory
            return factory

        return deco

    def make(self, name: str, **options: Any) -> T:
        """An instance by name; ValueError naming the known ones when the name is unknown."""
        if name not in self.factories:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self.factories)}")
        return self.factories[name](**options)

    def __contains__(self, name: object) -> bool:
        return name in self.factories

    def names(self) -> list[str]:
        return sorted(self.factories)
