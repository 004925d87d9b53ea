"""Which warehouse (DuckDB) errors the caller caused and which are failures underneath: the
CLI's exit code (2: bad input, fix the command; 1: a runtime failure, fix the cause and re-run)
asks here, so that it imports no DuckDB."""

from __future__ import annotations

import duckdb

_BAD_INPUT = (
    duckdb.ParserException,  # SQL that does not parse
    duckdb.SyntaxException,
    duckdb.BinderException,  # an unknown column or function, a type mismatch
    duckdb.CatalogException,  # an unknown table or schema
    duckdb.InvalidInputException,
    duckdb.ConversionException,  # a value that cannot be cast
    duckdb.ConstraintException,  # a write that breaks a key or NOT NULL
    duckdb.NotImplementedException,  # a feature DuckDB does not support
)


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an error raised by DuckDB (a query, the catalog, its files)."""
    return isinstance(exc, duckdb.Error)


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc`` is a DuckDB error caused by what was asked: SQL that does not parse or
    bind, an unknown table or column, a value that does not convert, a broken constraint, an
    unsupported feature. Other DuckDB errors (I/O, out of memory, internal, a transaction
    conflict) are runtime failures; an exception that is not DuckDB's is neither (False)."""
    return isinstance(exc, _BAD_INPUT)
