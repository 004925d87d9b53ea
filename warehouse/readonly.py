"""Read-only SQL over the warehouse for people: ``webloop sql`` and the dashboard's SQL page.

::

    from warehouse.readonly import read_query
    result = read_query("SELECT status, count(*) FROM trajectories GROUP BY 1")
    result.frame          # a polars frame (at most ``max_rows`` rows)
    result.truncated      # True when the query had more rows than that

The connection is the sandboxed one of :mod:`warehouse.sandbox`: DuckDB attaches the DuckLake
catalog first, then ``enable_external_access = false`` with ``allowed_directories`` set to the
lake's data path and ``lock_configuration = true``. The lake's tables read as usual; reading
or writing any other file (``read_text('/etc/passwd')``, ``COPY … TO``), the network
(``read_csv('http://…')``), ATTACH, INSTALL/LOAD, SET and every data change are refused with
:class:`ReadOnlyQueryError` saying why. Nothing is created: a home without a warehouse raises
:class:`~warehouse.connection.NoWarehouseError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from warehouse.config import WarehouseConfig, redact
from warehouse.connection import NoWarehouseError, WarehouseError
from warehouse.retry import retrying
from warehouse.sandbox import open_sandboxed
from warehouse.store import Warehouse
from warehouse.usersql import (
    DEFAULT_TIMEOUT_S,
    SqlInterruptedError,
    SqlRefusedError,
    SqlTimeoutError,
    run_user_sql,
)

__all__ = [
    "NoWarehouseError",
    "QueryResult",
    "ReadOnlyQueryError",
    "open_readonly",
    "read_query",
    "run_readonly",
]

DEFAULT_MAX_ROWS = 10_000


class ReadOnlyQueryError(WarehouseError):
    """A read-only query was refused (it reaches outside the warehouse or changes something)
    or failed (it does not parse, names an unknown table); the message says which and why."""


@dataclass(frozen=True)
class QueryResult:
    """What a read-only query returned.

    Attributes:
        frame: the rows of the last statement's result (empty, no columns, for a statement
            without a result).
        truncated: the result had more than ``max_rows`` rows; ``frame`` holds the first ones.
        statements: how many statements ran.
    """

    frame: pl.DataFrame
    truncated: bool
    statements: int


def open_readonly(cfg: WarehouseConfig | None = None) -> Warehouse:
    """The sandboxed, read-only warehouse of ``cfg`` (default: from the environment). Keep it
    open to run several queries (:func:`run_readonly`); close it when done."""
    return open_sandboxed(cfg, write=False)


def run_readonly(
    wh: Warehouse,
    query: str,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> QueryResult:
    """Run ``query`` (SELECT / EXPLAIN only) on a warehouse from :func:`open_readonly`, on a
    fresh cursor (nothing one query does is seen by the next), stopped after ``timeout_s``.

    Raises :class:`ReadOnlyQueryError` for refused, failing or timed-out SQL; at most
    ``max_rows`` rows of the result are fetched."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")

    def fetch(cur: duckdb.DuckDBPyConnection) -> pl.DataFrame:
        reader = cur.fetch_record_batch(min(max_rows + 1, 100_000))
        batches, rows = [], 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if rows > max_rows:
                break
        return _frame(batches, reader.schema)

    def attempt() -> tuple[pl.DataFrame | None, int]:
        return run_user_sql(wh.con, query, write=False, timeout_s=timeout_s, fetch=fetch)

    try:
        frame, n = _io_retry(attempt)
        if frame is None:
            return QueryResult(pl.DataFrame(), False, n)
    except (SqlRefusedError, SqlTimeoutError, SqlInterruptedError) as exc:
        raise ReadOnlyQueryError(str(exc)) from None
    except duckdb.Error as exc:
        msg = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, wh.cfg.secret)
        raise ReadOnlyQueryError(f"the query failed: {msg}") from None
    return QueryResult(frame.head(max_rows), frame.height > max_rows, n)


def _io_error(exc: BaseException) -> bool:
    """A SQLite catalog attached READ_ONLY can answer "disk I/O error" while another process
    commits; the read succeeds when tried again."""
    return isinstance(exc, duckdb.Error) and "disk I/O error" in str(exc)


_io_retry = retrying(attempts=8, retry_on=_io_error, base_delay=0.05, max_delay=0.5)


def read_query(
    query: str, cfg: WarehouseConfig | None = None, *, max_rows: int = DEFAULT_MAX_ROWS
) -> QueryResult:
    """Open the warehouse read-only and sandboxed, run ``query``, close it (see the module
    docstring). This is what ``webloop sql`` (without ``--write``) runs."""
    with open_readonly(cfg) as wh:
        return run_readonly(wh, query, max_rows=max_rows)


def _frame(batches: list, schema: object) -> pl.DataFrame:
    import pyarrow as pa

    table = pa.Table.from_batches(batches, schema=schema)  # type: ignore[arg-type]
    out = pl.from_arrow(table)
    return out if isinstance(out, pl.DataFrame) else out.to_frame()
