"""Migrations from empty, schema/record agreement, and refusing a newer schema."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from warehouse import SchemaTooNewError, Warehouse, WarehouseConfig, migrations
from warehouse.connection import LAKE, WarehouseError, connect
from warehouse.records import RECORD_TYPES, column_types


def test_migrate_from_empty_creates_every_table_and_records_the_version(cfg: WarehouseConfig):
    con = connect(cfg)
    assert migrations.current_version(con) == 0
    applied = migrations.migrate(con)
    assert applied == list(range(1, migrations.latest_version() + 1))
    assert migrations.current_version(con) == migrations.latest_version()
    tables = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [LAKE]
        ).fetchall()
    }
    leases = {"run_leases", "run_lease_beats"}  # warehouse/leases.py, no record types
    assert {r.TABLE for r in RECORD_TYPES} | {"webloop_schema"} | leases == tables
    assert migrations.migrate(con) == []  # second run applies nothing
    con.close()


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.TABLE)
def test_table_columns_match_the_record_fields(wh: Warehouse, cls):
    described = wh.sql(
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = ? AND table_name = ? ORDER BY column_index",
        [LAKE, cls.TABLE],
    )
    expected = [(name, sql) for name, (_, sql) in column_types(cls).items()]
    assert list(described.iter_rows()) == expected
    assert [f.name for f in dataclasses.fields(cls)] == [c for c, _ in expected]


def test_opening_a_warehouse_newer_than_the_code_is_a_clear_error(cfg: WarehouseConfig):
    with Warehouse.open(cfg) as wh:
        wh.con.execute(
            "INSERT INTO webloop_schema VALUES (?, 'from_the_future', now())",
            [migrations.latest_version() + 1],
        )
    with pytest.raises(SchemaTooNewError, match="only knows versions up to"):
        Warehouse.open(cfg)
    with pytest.raises(SchemaTooNewError):
        Warehouse.open(cfg, read_only=True)


def test_a_gap_in_the_migration_files_is_reported(tmp_path: Path):
    d = tmp_path / "schema"
    d.mkdir()
    shutil.copy(migrations.SCHEMA_DIR / "0001_init.sql", d / "0001_init.sql")
    (d / "0003_later.sql").write_text("CREATE TABLE x (a INTEGER);")
    with pytest.raises(WarehouseError, match="migration 0002 is missing"):
        migrations.available(d)


def test_a_new_migration_file_is_applied_to_an_existing_warehouse(
    cfg: WarehouseConfig, tmp_path: Path
):
    d = tmp_path / "schema"
    d.mkdir()
    for f in migrations.SCHEMA_DIR.glob("*.sql"):
        shutil.copy(f, d / f.name)
    with Warehouse.open(cfg):
        pass
    nxt = migrations.latest_version() + 1
    (d / f"{nxt:04d}_add_notes.sql").write_text("CREATE TABLE notes (id VARCHAR, body VARCHAR);")
    con = connect(cfg)
    assert migrations.migrate(con, d) == [nxt]
    assert migrations.current_version(con) == nxt
    con.execute("INSERT INTO notes VALUES ('a', 'b')")
    assert con.execute("SELECT count(*) FROM notes").fetchone()[0] == 1
    con.close()


def test_steps_written_before_token_ids_read_as_unrecorded_after_the_upgrade(
    cfg: WarehouseConfig, tmp_path: Path
):
    """A warehouse at schema 0006 (steps without ``token_ids``/``image_spans``) opens at the
    current version; its steps keep their values and read the new columns as NULL."""
    d = tmp_path / "schema"
    d.mkdir()
    for f in sorted(migrations.SCHEMA_DIR.glob("*.sql"))[:6]:
        shutil.copy(f, d / f.name)
    con = connect(cfg)
    assert migrations.migrate(con, d) == list(range(1, 7))
    con.execute(
        f"INSERT INTO {LAKE}.steps (traj_id, step_idx, model_output, logprob) "
        "VALUES ('t1', 0, 'Action: click(e1)', -1.5)"
    )
    con.close()
    with Warehouse.open(cfg) as wh:
        assert migrations.current_version(wh.con) == migrations.latest_version() >= 7
        row = wh.sql("SELECT * FROM steps").row(0, named=True)
        assert (row["model_output"], row["logprob"]) == ("Action: click(e1)", -1.5)
        assert row["token_ids"] is None and row["image_spans"] is None
