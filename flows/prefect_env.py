"""Prefect settings for running offline, set before prefect is imported.

- No analytics (no network here), no empty ``PREFECT_API_URL`` (an empty string breaks the
  client; unset means "start a temporary local server").
- A longer start-up timeout for that temporary server: the first start with a fresh
  ``PREFECT_HOME`` takes 13-16 s on 2 cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}


def configure() -> None:
    """Apply webloop's Prefect defaults (explicit environment settings win)."""
    if os.environ.get("PREFECT_API_URL", None) == "":
        del os.environ["PREFECT_API_URL"]
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)


_PROGRESS: dict[str, Callable[..., None]] = {}


@contextmanager
def progress_to(flow_name: str, fn: Callable[..., None] | None) -> Iterator[None]:
    """Hand a progress callback to a flow's tasks for the duration of one run (callables cannot
    be Prefect parameters; tasks run in this process and read it with :func:`progress_of`)."""
    if fn is not None:
        _PROGRESS[flow_name] = fn
    try:
        yield
    finally:
        _PROGRESS.pop(flow_name, None)


def progress_of(flow_name: str) -> Callable[..., None] | None:
    return _PROGRESS.get(flow_name)
