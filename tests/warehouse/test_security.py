"""Hardening: user SQL stays inside the warehouse, read-only opens write nothing, a first run
creates nothing by accident, and a hostile Online-Mind2Web folder set imports safely."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from warehouse import Warehouse, WarehouseConfig, sample
from warehouse.connection import NoWarehouseError, connect
from warehouse.sandbox import SqlRefusedError, open_sandboxed, run_user_sql


def webloop(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
    env.pop("WEBLOOP_WAREHOUSE", None)
    return subprocess.run(
        [sys.executable, "-m", "cli.app", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> WarehouseConfig:
    home = tmp_path_factory.mktemp("sec") / "home"
    cfg = WarehouseConfig.from_env(home=home, warehouse="")
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=1, n_tasks=3, samples=2))
    return cfg


@pytest.fixture(scope="module")
def secret_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "private.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x VARCHAR)")
    db.execute("INSERT INTO t VALUES ('TOPSECRET')")
    db.commit()
    db.close()
    return path


def _fingerprint(*paths: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for root in paths:
        for p in sorted([root, *root.rglob("*")] if root.is_dir() else [root]):
            st = p.stat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out[str(p)] = (st.st_mtime_ns, digest)
    return out


# -- user SQL: the sandbox -----------------------------------------------------------------------


def test_user_sql_reads_the_lake_tables(lake: WarehouseConfig):
    with open_sandboxed(lake) as wh:
        result, n = run_user_sql(
            wh.con,
            "SELECT t.task_id, count(*) AS steps FROM trajectories t JOIN steps s "
            "USING (traj_id) GROUP BY ALL ORDER BY 1",
        )
        rows = result.rows()
        assert n == 1 and len(rows) == 3 and all(steps > 0 for _, steps in rows)
        result, n = run_user_sql(
            wh.con, "SELECT count(*) FROM lake.snapshots(); EXPLAIN SELECT * FROM tasks"
        )
        assert n == 2
        files = run_user_sql(wh.con, "SELECT count(*) FROM ducklake_list_files('lake', 'steps')")
        assert files[0].item() > 0  # the lake's own Parquet files stay readable


REFUSED = [
    ("SELECT * FROM read_text('/etc/passwd')", "outside the warehouse"),
    ("SELECT * FROM read_csv('/etc/passwd', sep=':')", "outside the warehouse"),
    ("SELECT * FROM read_parquet('https://evil.example/x.parquet')", "outside the warehouse"),
    ("SELECT * FROM glob('/etc/*')", "outside the warehouse"),
    ("COPY (SELECT 1) TO '/tmp/webloop-leak.csv'", "COPY statement"),
    ("ATTACH '/tmp/webloop-other.db' AS other", "ATTACH statement"),
    ("ATTACH 'sqlite:/tmp/webloop-other.sqlite' AS other", "ATTACH statement"),
    ("INSTALL httpfs", "INSTALL statement"),
    ("LOAD httpfs", "LOAD statement"),
    ("SET enable_external_access = true", "SET statement"),
    ("RESET lock_configuration", "SET statement"),
    ("EXPORT DATABASE '/tmp/webloop-export'", "EXPORT statement"),
    ("SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')", "query"),
    ("SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)", "ducklake_clean"),
]


@pytest.mark.parametrize(("query", "why"), REFUSED)
def test_user_sql_cannot_reach_files_network_or_settings(lake, query: str, why: str):
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError, match=why):
        run_user_sql(wh.con, query)
    assert not Path("/tmp/webloop-leak.csv").exists()
    assert not Path("/tmp/webloop-other.sqlite").exists()


def test_a_file_named_as_a_table_is_not_read(lake):
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError, match="/etc/passwd"):
        run_user_sql(wh.con, "SELECT * FROM '/etc/passwd'")  # no replacement scan of files


def test_the_sqlite_scanner_cannot_read_other_databases(lake, secret_db: Path):
    """The sqlite extension (loaded for the catalog) ignores DuckDB's file settings."""
    with open_sandboxed(lake) as wh:
        for q in (
            f"SELECT * FROM sqlite_scan('{secret_db}', 't')",
            f"SELECT * FROM \"SQLITE_SCAN\" /* hidden */ ('{secret_db}', 't')",
            f"SELECT * FROM main.sqlite_attach('{secret_db}')",
            f"SELECT * FROM sqlite_scan('{lake.catalog}', 'ducklake_snapshot')",
        ):
            with pytest.raises(SqlRefusedError, match="sqlite_"):
                run_user_sql(wh.con, q)


def test_the_connection_itself_refuses_files_even_without_the_guard(lake):
    """Second layer: DuckDB's own settings, locked, on the sandboxed connection."""
    con = connect(lake, read_only=True, sandboxed=True)
    try:
        for q in (
            "SELECT * FROM read_text('/etc/passwd')",
            "COPY (SELECT 1) TO '/tmp/webloop-leak.csv'",
            "ATTACH '/tmp/webloop-other.db' AS other",
        ):
            with pytest.raises(duckdb.PermissionException):
                con.execute(q)
        for q in ("SET enable_external_access = true", "SET allowed_directories = ['/']"):
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                con.execute(q)
        with pytest.raises(duckdb.Error):
            con.execute("LOAD httpfs")
        assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] == 3
    finally:
        con.close()


def test_write_mode_changes_data_but_still_not_files(tmp_path: Path):
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")
    with open_sandboxed(cfg, write=True) as wh:  # creates and migrates a fresh warehouse
        run_user_sql(wh.con, "INSERT INTO pins VALUES ('p1', 1, 'x', now())", write=True)
        assert run_user_sql(wh.con, "SELECT count(*) FROM pins")[0].item() == 1
        for q in ("COPY pins TO '/tmp/webloop-leak.csv'", "ATTACH 'sqlite:/tmp/x.db' AS x"):
            with pytest.raises(SqlRefusedError):
                run_user_sql(wh.con, q, write=True)
        with pytest.raises(SqlRefusedError, match="read_text"):
            run_user_sql(
                wh.con,
                "CREATE TABLE t AS SELECT * FROM read_text('/etc/passwd')",
                write=True,
                schema=True,
            )
        with pytest.raises(SqlRefusedError, match="read-only"):
            run_user_sql(wh.con, "DELETE FROM pins")


# -- read-only opens write nothing; a first run creates nothing ----------------------------------


@pytest.mark.slow  # CLI subprocesses
def test_read_only_commands_leave_catalog_and_data_untouched(lake: WarehouseConfig):
    before = _fingerprint(Path(lake.catalog), Path(lake.data_path), Path(lake.blob_path))
    for args in (
        ("sql", "SELECT count(*) AS n FROM steps", "--format", "json"),
        ("warehouse", "info", "--format", "json"),
    ):
        proc = webloop(lake.home, *args)
        assert proc.returncode == 0, proc.stderr
    with open_sandboxed(lake) as wh:
        assert run_user_sql(wh.con, "SELECT * FROM steps")[0].height > 0
    assert _fingerprint(Path(lake.catalog), Path(lake.data_path), Path(lake.blob_path)) == before


@pytest.mark.slow  # CLI subprocesses
def test_cli_sql_refuses_files_with_a_clear_message(lake: WarehouseConfig):
    proc = webloop(lake.home, "sql", "SELECT * FROM read_text('/etc/passwd')")
    assert proc.returncode == 2, proc.stdout
    assert "root:" not in proc.stdout and "outside the warehouse" in proc.stderr
    proc = webloop(lake.home, "sql", "COPY (SELECT 1) TO '/tmp/webloop-leak.csv'", "--write")
    assert proc.returncode == 2 and "COPY" in proc.stderr
    assert not Path("/tmp/webloop-leak.csv").exists()


@pytest.mark.slow  # CLI subprocesses
def test_a_first_query_on_a_fresh_home_says_how_to_create_a_warehouse(tmp_path: Path):
    home = tmp_path / "fresh"
    for args in (("sql", "select 1"), ("warehouse", "info")):
        proc = webloop(home, *args)
        assert proc.returncode == 2, proc.stdout
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "no warehouse" in proc.stderr and "webloop tasks generate" in proc.stderr
        assert "explicitly disabled" not in proc.stderr
    left = {p.relative_to(home).parts[0] for p in home.rglob("*")} if home.exists() else set()
    assert left <= {"logs"}  # the CLI's error log at most: no catalog, no lake or blob folders
    cfg = WarehouseConfig.from_env(home=tmp_path / "fresh2", warehouse="")
    with pytest.raises(NoWarehouseError, match="no warehouse"):
        open_sandboxed(cfg)
    with pytest.raises(NoWarehouseError):
        Warehouse.open(cfg, read_only=True)
    assert not (tmp_path / "fresh2").exists()


def test_a_failed_open_removes_what_it_created(tmp_path: Path, monkeypatch):
    import warehouse.connection as connection

    def failing(fn, *, what, **kw):
        if what == "attach":
            raise duckdb.IOException("simulated: disk full")
        return fn()

    monkeypatch.setattr(connection, "with_retry", failing)
    home = tmp_path / "home"
    (home / "keep").mkdir(parents=True)
    cfg = WarehouseConfig.from_env(home=home, warehouse="")
    with pytest.raises(connection.WarehouseError, match="disk full"):
        Warehouse.open(cfg)
    assert [p.name for p in home.iterdir()] == ["keep"]  # no catalog, no lake/ or data/ folders


# -- a hostile Online-Mind2Web folder set, through the CLI -----------------------------------


@pytest.mark.slow  # CLI subprocesses
def test_cli_import_reports_rejected_screenshots_per_folder(tmp_path: Path):
    from tests.warehouse.test_om2w import _mixed_folder_set

    root = _mixed_folder_set(tmp_path)
    home = tmp_path / "home"
    proc = webloop(home, "import", "om2w", str(root), "--run", "mixed")
    assert proc.returncode == 0, proc.stderr
    assert "imported 3 trajectories" in proc.stdout
    assert "screenshots rejected" in proc.stdout and "7 in 2 folder(s)" in proc.stdout
    assert "rejected junk: 4 screenshot(s)" in proc.stderr
    assert "rejected links: 3 screenshot(s)" in proc.stderr
    assert "2_full_screenshot.png: a git-lfs pointer" in proc.stderr
    assert "malformed linked_result: result.json is a link that leaves" in proc.stderr
    out = json.loads(
        webloop(
            home,
            "sql",
            "SELECT count(*) FILTER (screenshot_hash IS NULL) AS empty, count(*) AS n, "
            "count(*) FILTER (action_text IS NOT NULL) AS acted FROM steps",
            "--format",
            "json",
        ).stdout
    )[0]
    assert out == {"empty": 7, "n": 14, "acted": 14}


def test_the_sandbox_over_a_postgresql_catalog(pg_cfg: WarehouseConfig):
    with Warehouse.open(pg_cfg) as wh:
        sample.load(wh, sample.generate(seed=2, n_tasks=2, samples=1))
    with open_sandboxed(pg_cfg) as wh:
        assert run_user_sql(wh.con, "SELECT count(*) FROM tasks")[0].item() == 2
        assert run_user_sql(wh.con, "SELECT count(*) FROM steps")[0].item() > 0
        for q in (
            "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
            "SELECT * FROM postgres_scan('host=evil.example dbname=x', 'public', 't')",
        ):
            with pytest.raises(SqlRefusedError, match="postgres_"):
                run_user_sql(wh.con, q)
        with pytest.raises(SqlRefusedError, match="outside the warehouse"):
            run_user_sql(wh.con, "SELECT * FROM read_text('/etc/passwd')")


def test_a_read_only_open_of_an_empty_postgresql_catalog(pg_url: str, tmp_path: Path):
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse=pg_url)
    with pytest.raises(NoWarehouseError, match="no warehouse"):
        open_sandboxed(cfg)
    assert not (tmp_path / "home").exists()
