"""Prefect settings for running offline, set before prefect is imported.

- No analytics (no network here), no empty ``PREFECT_API_URL`` (an empty string breaks the
  client; unset means "start a temporary local server").
- A longer start-up timeout for that temporary server: the first start with a fresh
  ``PREFECT_HOME`` takes 13-16 s on 2 cores.
"""

from __future__ import annotations

import os

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
