"""A name → factory registry: policies, judges, PRM scorers (and later advantage estimators)
are looked up by the name a user types."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def check_needs(kind: str, name: str, needs: Sequence[str], known: Mapping[str, str]) -> None:
    """Refuse needs a component declares that the stages do not know (``known``: need →
    what it means)."""
    unknown = sorted(set(needs) - set(known))
    if unknown:
        raise ValueError(f"{kind} {name!r}: unknown need(s) {unknown}; known: {sorted(known)}")


def check_once(kind: str, name: str, old: Callable | None, new: Callable) -> None:
    """Refuse a second, different function or class under a registered ``name`` (``old``: the
    one registered, None if none): an import would otherwise replace a built-in silently. The
    same definition imported again (a module reloaded) is fine."""
    where = lambda f: f"{f.__module__}.{f.__qualname__}"  # noqa: E731
    if old is not None and where(old) != where(new):
        raise ValueError(f"{kind} {name!r} is registered already ({where(old)})")


def keyword_options(fn: Callable, skip: int = 0) -> dict[str, Any]:
    """A component's options: its factory's parameters after the first ``skip`` (a class: its
    constructor's, ``self`` left out), name → default (``inspect.Parameter.empty``: required).
    ``**kwargs`` parameters are not options."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    keep = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in params if p.kind in keep}


def check_options(kind: str, name: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse options a component does not take, naming the ones it does."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{kind} {name!r}: unknown option(s) {unknown}; known: {sorted(known)}")


def option_help(fn: Callable) -> dict[str, str]:
    """Each option's help text: the ``:param name: text`` entries of the factory's docstring (a
    class: its constructor's docstring, else the class's), continuation lines joined."""
    doc = inspect.getdoc(fn.__init__) if isinstance(fn, type) else inspect.getdoc(fn)
    if isinstance(fn, type) and ":param" not in (doc or ""):
        doc = inspect.getdoc(fn)
    out: dict[str, str] = {}
    current = None
    for line in (doc or "").splitlines():
        m = re.match(r"\s*:param\s+(\w+):\s*(.*)", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.strip() and not line.lstrip().startswith(":"):
            out[current] += " " + line.strip()
        else:
            current = None
    return out
