"""The one rule that names runs (stages/identity.py): operational settings never join, a
config's first settings always do, later ones only when used, nested ones as written."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stages.identity import Identity


@dataclass(frozen=True)
class Inner:
    a: int = 1


@dataclass(frozen=True)
class Config:
    n: int = 5  # first release
    workers: int = 0  # operational
    noise: float = 0.0  # later, default 0
    cap: int | None = None  # later
    select: str = "all"  # later, used only under a cap
    inner: Inner = field(default_factory=Inner)  # later, written by its own rule


RULE = Identity(
    excluded=("workers",),
    later=("noise", "cap", "inner"),
    used={"select": lambda c: c.cap is not None and c.select != "all"},
    written={"inner": lambda c: {"a_twice": 2 * c.inner.a}},
)


def test_first_settings_always_join_and_operational_ones_never():
    assert RULE.of(Config()) == {"n": 5}
    assert RULE.of(Config(n=5, workers=8)) == {"n": 5}  # how it runs names nothing


def test_later_settings_join_only_when_used():
    assert RULE.of(Config(noise=0.5)) == {"n": 5, "noise": 0.5}
    assert RULE.of(Config(select="top")) == {"n": 5}  # no cap: select changes nothing
    assert RULE.of(Config(cap=3, select="top")) == {"n": 5, "cap": 3, "select": "top"}
    assert RULE.of(Config(inner=Inner(a=4))) == {"n": 5, "inner": {"a_twice": 8}}


def test_a_rule_naming_a_field_the_config_lacks_is_refused():
    with pytest.raises(ValueError, match=r"Config has no field\(s\) \['sed'\]"):
        Identity(later=("sed",)).of(Config())
