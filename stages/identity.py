"""How a stage config names its runs: one rule for every stage.

A run's id is a hash of its config's identity (:func:`warehouse.ids.run_id_for`), and a user's
warehouse resumes a run by finding that id again, so the identity of a configuration must never
change under it. The rule:

* settings that say how a run executes, not what it computes (concurrency, workers, where it
  is served, when it stops and saves), or that another part of the id already names, never
  join (``excluded``);
* the settings a config had when it was first released always join (they named its runs from
  the start);
* a setting added later (``later``) joins only when it is used: by default when it differs from
  its default, or as ``used`` says for one whose default is not what runs did before it existed
  (so every earlier run keeps its id, and a run that uses the setting is a new run);
* a setting joins as its plain value, or as ``written`` says (a nested stage config by its own
  identity).

Each stage config declares its :class:`Identity` beside its fields; an ``identity()`` method adds
only what is not a field (the expert's action space, a nested config's renamed keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stages.config import default_of


@dataclass(frozen=True)
class Identity:
    """The identity rule's data for one config class (see the module docstring)."""

    excluded: tuple[str, ...] = ()
    later: tuple[str, ...] = ()
    used: Mapping[str, Callable[[Any], bool]] = field(default_factory=dict)  # (later ones too)
    written: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)

    def of(self, cfg: Any) -> dict[str, Any]:
        """``cfg``'s identity: its fields (as plain values) by the rule."""
        names = {f.name for f in dataclasses.fields(cfg)}
        later = set(self.later) | set(self.used)
        unknown = sorted((set(self.excluded) | later | set(self.written)) - names)
        if unknown:
            raise ValueError(f"{type(cfg).__name__} has no field(s) {unknown}")
        plain = dataclasses.asdict(cfg)
        out = {}
        for f in dataclasses.fields(cfg):
            if f.name in self.excluded or (f.name in later and not self._used(cfg, f)):
                continue
            out[f.name] = self.written[f.name](cfg) if f.name in self.written else plain[f.name]
        return out

    def _used(self, cfg: Any, f: dataclasses.Field) -> bool:
        if f.name in self.used:
            return self.used[f.name](cfg)
        return getattr(cfg, f.name) != default_of(f)
