"""SQL text for the few statements that take no parameters (ATTACH options, CREATE SECRET)."""

from __future__ import annotations


def sql_string(value: str) -> str:
    """Quote a string literal for the few statements that take no parameters (ATTACH options,
    secrets).

    Only configuration (paths, connection strings, credentials) goes through here, never row
    values: those are parameters.
    """
    return "'" + value.replace("'", "''") + "'"
