"""Security round 3, SQL (issue 49): every mode refuses every catalog but the lake — the
DuckLake catalog database itself (its deletion queue, its stored view SQL, its snapshots),
system views named as strings, ``temp``/``memory`` — by binding the statement and walking the
operators of its plan; read mode refuses a lake view whose stored SQL fails the read-only rules;
functions come from a vetted allow-list (``json_serialize_plan`` binds any SQL text)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig, sample
from warehouse.sandbox import SqlRefusedError, open_sandboxed, run_user_sql
from warehouse.versions import current_snapshot

META = "__ducklake_metadata_lake"


@pytest.fixture
def lake(tmp_path: Path) -> WarehouseConfig:
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=3, n_tasks=2, samples=1))
    return cfg


def catalog_rows(cfg: WarehouseConfig, table: str) -> list[tuple]:
    """What the SQLite catalog holds, read past DuckDB."""
    (db,) = Path(cfg.home).rglob("*.sqlite")
    con = sqlite3.connect(db)
    try:
        return con.execute(f"SELECT * FROM {table}").fetchall()
    finally:
        con.close()


def refused(cfg: WarehouseConfig, query: str, **mode: bool) -> str:
    with open_sandboxed(cfg, write=bool(mode)) as wh, pytest.raises(SqlRefusedError) as err:
        run_user_sql(wh.con, query, **mode)
    return str(err.value)


@pytest.mark.parametrize(
    "query",
    [
        # a row in the deletion queue: `warehouse maintain` would delete any file named there
        f"INSERT INTO {META}.ducklake_files_scheduled_for_deletion "
        "VALUES (999, '/etc/hostname', false, now())",
        f'INSERT INTO "{META}".main.ducklake_files_scheduled_for_deletion '
        "SELECT 999, '/etc/hostname', false, now()",
        # snapshots erased past rollback
        f"DELETE FROM {META}.ducklake_snapshot",
        # a stored view's SQL rewritten
        f"UPDATE {META}.ducklake_view SET sql = 'SELECT 1'",
        # a write that only reads the catalog database
        f"UPDATE tasks SET instruction = (SELECT max(path) FROM {META}.ducklake_data_file)",
        # system views named as strings, and other catalogs
        "UPDATE tasks SET instruction = (SELECT string_agg(database_name, ',') "
        "FROM 'duckdb_databases')",
        "INSERT INTO memory.main.x SELECT 1",
        "INSERT INTO temp.main.x SELECT 1",
    ],
)
def test_write_mode_cannot_touch_the_catalog_database_or_other_catalogs(lake, query: str):
    deletions = catalog_rows(lake, "ducklake_files_scheduled_for_deletion")
    snapshots = catalog_rows(lake, "ducklake_snapshot")
    with open_sandboxed(lake) as wh:
        before = current_snapshot(wh)
    message = refused(lake, query, write=True)
    assert "refusing" in message or "refused" in message
    assert catalog_rows(lake, "ducklake_files_scheduled_for_deletion") == deletions
    assert catalog_rows(lake, "ducklake_snapshot") == snapshots
    with open_sandboxed(lake) as wh:
        assert current_snapshot(wh) == before
        frame, _ = run_user_sql(wh.con, "SELECT count(*) AS n FROM tasks WHERE instruction = ''")
    assert frame["n"][0] == 0  # no task's instruction was overwritten


def test_the_catalog_names_are_refused_in_schema_statements_too(lake):
    message = refused(lake, f"DROP TABLE {META}.ducklake_snapshot", write=True, schema=True)
    assert META in message
    assert catalog_rows(lake, "ducklake_snapshot")


def test_write_mode_still_changes_the_lakes_tables(lake):
    with open_sandboxed(lake, write=True) as wh:
        run_user_sql(
            wh.con,
            "UPDATE tasks SET difficulty = 9 WHERE task_id IN "
            "(SELECT task_id FROM tasks ORDER BY task_id LIMIT 1)",
            write=True,
        )
        frame, _ = run_user_sql(wh.con, "SELECT count(*) AS n FROM tasks WHERE difficulty = 9")
    assert frame["n"][0] == 1


@pytest.mark.parametrize(
    "query",
    [
        # binds any SQL text: another file's column names, file existence, denied settings
        "SELECT json_serialize_plan('SELECT * FROM duckdb_settings()')",
        "SELECT json_serialize_sql('SELECT 1')",
        "SELECT json_deserialize_sql('{}')",
        "SELECT getvariable('x')",
        "SELECT current_query()",
        "SELECT pg_get_viewdef(1)",
    ],
)
def test_read_mode_calls_only_vetted_functions(lake, query: str):
    assert "not a function SQL here may call" in refused(lake, query)


def test_vetted_functions_still_run(lake):
    with open_sandboxed(lake) as wh:
        frame, _ = run_user_sql(
            wh.con,
            "SELECT lower('AB') AS s, round(2.5) AS r, date_trunc('day', now()) IS NOT NULL AS d,"
            " json_extract('{\"a\": 1}', '$.a')::INT AS j, list_sum([1, 2]) AS l",
        )
    assert frame.row(0) == ("ab", 3.0, True, 1, 3)


def test_a_lake_view_whose_stored_sql_fails_the_rules_is_refused_in_read_mode(lake):
    with open_sandboxed(lake, write=True) as wh:
        # a view made through --schema, which reads the catalog database: its SQL is stored
        # by DuckLake, and read-only SQL and the dashboard would run it
        wh.con.execute(f"CREATE VIEW lake.peek AS SELECT path FROM {META}.ducklake_data_file")
        wh.con.execute("CREATE VIEW lake.settings AS SELECT current_setting('threads') AS t")
        wh.con.execute("CREATE VIEW lake.fine AS SELECT task_id FROM tasks")
    assert "view peek" in refused(lake, "SELECT * FROM peek")
    assert "view settings" in refused(lake, "SELECT * FROM settings")
    with open_sandboxed(lake) as wh:
        frame, _ = run_user_sql(wh.con, "SELECT count(*) AS n FROM fine")
    assert frame["n"][0] == 2
