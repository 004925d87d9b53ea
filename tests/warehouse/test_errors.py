"""Which warehouse errors are bad input (``warehouse.errors``): the CLI's exit code 2 vs 1."""

from __future__ import annotations

import duckdb
import pytest

from warehouse import Warehouse
from warehouse.errors import is_bad_input, is_database_error


@pytest.mark.parametrize(
    ("exc", "database", "bad_input"),
    [
        (duckdb.ParserException("syntax error"), True, True),
        (duckdb.BinderException("no column"), True, True),
        (duckdb.CatalogException("no table"), True, True),
        (duckdb.ConversionException("not an int"), True, True),
        (duckdb.ConstraintException("duplicate key"), True, True),
        (duckdb.NotImplementedException("unsupported"), True, True),
        (duckdb.IOException("could not read"), True, False),
        (duckdb.InternalException("boom"), True, False),
        (duckdb.OutOfMemoryException("oom"), True, False),
        (duckdb.TransactionException("conflict"), True, False),
        (ValueError("not duckdb"), False, False),
        (KeyError("traj"), False, False),
    ],
)
def test_classification(exc: BaseException, database: bool, bad_input: bool):
    assert (is_database_error(exc), is_bad_input(exc)) == (database, bad_input)


@pytest.mark.parametrize(
    "query", ["SELEC 1", "SELECT nope FROM tasks", "SELECT * FROM nosuch", "SELECT 'a'::INT"]
)
def test_errors_from_real_queries_are_bad_input(wh: Warehouse, query: str):
    with pytest.raises(duckdb.Error) as info:
        wh.sql(query)
    assert is_database_error(info.value) and is_bad_input(info.value)
