"""warehouse.readonly: the lake's tables read; files, network, ATTACH, INSTALL and writes are
refused with a clear error (external access is disabled after the catalog is attached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig
from warehouse.connection import NoWarehouseError
from warehouse.readonly import ReadOnlyQueryError, open_readonly, read_query, run_readonly
from warehouse.records import Trajectory


@pytest.fixture(scope="module")
def ro(tmp_path_factory) -> tuple[WarehouseConfig, Warehouse, Path]:
    base = tmp_path_factory.mktemp("ro")
    cfg = WarehouseConfig.from_env(home=base / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        wh.write([Trajectory("t1", "r1", "k1", "expert", "success", n_steps=2)])
        wh.write([Trajectory("t2", "r1", "k1", "expert", "failure", n_steps=1)])
    (base / "secret.txt").write_text("top secret\n")
    with open_readonly(cfg) as wh:
        yield cfg, wh, base


def test_warehouse_tables_read(ro):
    _, wh, _ = ro
    res = run_readonly(wh, "SELECT traj_id, status FROM trajectories ORDER BY traj_id")
    assert res.frame.rows() == [("t1", "success"), ("t2", "failure")]
    assert not res.truncated and res.statements == 1


def test_rows_are_capped(ro):
    _, wh, _ = ro
    res = run_readonly(wh, "SELECT * FROM range(25)", max_rows=10)
    assert res.frame.height == 10 and res.truncated


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT * FROM read_text('{base}/secret.txt')", "outside the warehouse"),
        ("SELECT * FROM read_text('/etc/passwd')", "outside the warehouse"),
        ("SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "outside the warehouse"),
        ("COPY (SELECT 1) TO '{base}/out.csv'", "COPY statement"),
        ("ATTACH '{base}/other.db' AS other", "ATTACH statement"),
        ("INSTALL httpfs", "refusing to run an INSTALL statement"),
        ("LOAD httpfs", "refusing to run a LOAD statement"),
        ("SET enable_external_access = true", "SET statement"),
        (
            "INSERT INTO trajectories (traj_id, run_id, task_id, policy, status) "
            "VALUES ('x', 'r', 'k', 'p', 'success')",
            "INSERT statement",
        ),
        ("DELETE FROM trajectories", "DELETE statement"),
        ("CREATE TABLE z AS SELECT 1", "CREATE statement"),
        ("SELECT * FROM sqlite_scan('{base}/x.sqlite', 't')", "refusing to call sqlite_scan"),
        ("/* é */ SELECT * FROM sqlite_scan('{base}/x.sqlite', 't')", "call sqlite_scan"),
        ("EXPLAIN ANALYSE COPY (SELECT 'x') TO '{base}/out.csv'", "EXPLAIN ANALYZE"),
        ("EXPLAIN ANALYZE CREATE TEMP VIEW tasks AS SELECT 1", "EXPLAIN ANALYZE"),
        ("SELECT path FROM duckdb_databases()", "refusing to call duckdb_databases"),
        ("PRAGMA database_list", "pragma_database_list"),
        ("SELECT * FROM query('SELECT 1')", "refusing to call query"),
    ],
)
def test_escapes_are_refused(ro, sql, why):
    _, wh, base = ro
    with pytest.raises(ReadOnlyQueryError, match=why) as err:
        run_readonly(wh, sql.format(base=base))
    assert "top secret" not in str(err.value)
    assert not (base / "out.csv").exists() and not (base / "other.db").exists()
    # the warehouse is untouched and still reads
    res = run_readonly(wh, "SELECT count(*) FROM trajectories")
    assert res.frame.item() == 2


def test_bad_sql_is_a_clear_error(ro):
    _, wh, _ = ro
    with pytest.raises(ReadOnlyQueryError, match=r"no warehouse table named 'nope'.*trajectories"):
        run_readonly(wh, "SELECT * FROM nope")
    with pytest.raises(ReadOnlyQueryError, match=r"the query failed: Binder Error.*nope"):
        run_readonly(wh, "SELECT nope FROM trajectories")
    with pytest.raises(ReadOnlyQueryError, match="the query failed: Parser Error"):
        run_readonly(wh, "SELEC 1")


def test_read_query_opens_and_closes(ro):
    cfg, _, _ = ro
    res = read_query("SELECT count(*) AS n FROM human_labels", cfg)
    assert res.frame.item() == 0 and res.frame.columns == ["n"] and res.statements == 1


def test_no_warehouse_creates_nothing(tmp_path):
    cfg = WarehouseConfig.from_env(home=tmp_path / "none", warehouse="")
    with pytest.raises(NoWarehouseError, match="no warehouse"):
        read_query("SELECT 1", cfg)
    assert not (tmp_path / "none").exists()
