"""Frames of rows computed in memory (a report's counts, agreement metrics, a diff summary), so
that code above the warehouse can print them the way it prints a query's result (the CLI's
``print_frame``: a table, CSV or JSON) without importing polars itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl


def rows_frame(rows: Sequence[Mapping[str, Any]], *, text: bool = False) -> pl.DataFrame:
    """A frame with one row per mapping of ``rows``; the columns are the mappings' keys, in the
    order the first one lists them, each typed from its values (``None``: null).

    ``text``: every column is a string column, whatever its values (which must then be
    strings or ``None``): a column that is ``None`` in every row still prints as text.
    """
    if text:
        columns = list(rows[0]) if rows else []
        return pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.Utf8))
    return pl.DataFrame(rows)
