"""Your own components, by module: ``WEBLOOP_PLUGINS=mylab.estimators,mylab.judges webloop ...``
imports those modules before the command runs, so what they register (an advantage estimator
with :func:`training.advantages.register`, a judge, a PRM scorer, a policy) is known to the CLI
and the stages by name, as the built-in ones are. Dask workers of a sharded stage import them
too (they inherit the variable; a remote cluster's workers need it set and the modules
importable there).
"""

from __future__ import annotations

import importlib
import os

from stages.config import ConfigError

ENV = "WEBLOOP_PLUGINS"


def load_plugins(value: str | None = None) -> list[str]:
    """Import the modules named in ``value`` (default: the ``WEBLOOP_PLUGINS`` environment
    variable; comma-separated, spaces ignored); the names imported. A module that cannot be
    imported is a :class:`ConfigError` naming it and why."""
    text = os.environ.get(ENV, "") if value is None else value
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import failure: say which module and why
            raise ConfigError(
                f"{ENV}: cannot import {name!r} ({type(exc).__name__}: {exc})"
            ) from exc
    return names
