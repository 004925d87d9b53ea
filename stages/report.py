"""Stage results as text for people: markdown tables (published as Prefect artifacts by
``flows``, shown by the CLI), percentages. Pure functions, no orchestrator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def cell(value: Any) -> str:
    """One table cell: floats rounded, ``|`` and newlines escaped."""
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Iterable[str] | None = None) -> str:
    """A markdown table of ``rows`` (the columns of the first row unless given)."""
    cols = list(columns) if columns is not None else list(rows[0]) if rows else []
    if not cols:
        return "_(none)_"
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def percent(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"
