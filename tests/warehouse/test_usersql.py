"""User SQL runs what the allow-list admits, on DuckDB's parse tree: the holes of the old
deny-list (byte offsets read as character indices, EXPLAIN ANALYSE, one shared connection, the
catalog password in the ATTACH string, DROP SCHEMA under --write) stay closed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.hypothesis_profiles import load
from warehouse import Warehouse, WarehouseConfig, sample
from warehouse.connection import connect
from warehouse.readonly import ReadOnlyQueryError, open_readonly, run_readonly
from warehouse.rollback import rollback
from warehouse.sandbox import (
    SqlInterruptedError,
    SqlRefusedError,
    SqlTimeoutError,
    open_sandboxed,
    run_user_sql,
)

load()

SECRET = "TOPSECRET-7f3a"
SLOW = "SELECT count(*) FROM range(100000000000) t(a) WHERE a % 7 = 3"  # hours of work


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> WarehouseConfig:
    home = tmp_path_factory.mktemp("usersql") / "home"
    cfg = WarehouseConfig.from_env(home=home, warehouse="")
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=3, n_tasks=3, samples=2))
    return cfg


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """Another data directory's SQLite database (a Prefect database, say) with a secret."""
    path = tmp_path_factory.mktemp("outside") / "OUTSIDE.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE s (x VARCHAR)")
    db.execute("INSERT INTO s VALUES (?)", [SECRET])
    db.commit()
    db.close()
    return path


@pytest.fixture
def orphan(lake: WarehouseConfig) -> Path:
    """A file in the lake's data folder that no snapshot references (a concurrent writer's
    not-yet-committed file): ducklake_delete_orphaned_files would delete it."""
    path = Path(lake.data_path) / "main" / "not-yet-committed.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    duckdb.sql(f"COPY (SELECT 1 AS x) TO '{path}' (FORMAT parquet)")
    yield path
    path.unlink(missing_ok=True)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


# -- finding 1: non-ASCII text no longer hides a call -------------------------------------------


@pytest.mark.parametrize("pad", ["", "/* é */ ", "/* 日本語のコメント */ ", "-- ü\n"])
def test_non_ascii_text_hides_no_scanner(lake, outside, pad: str):
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError, match="sqlite_scan"):
        run_user_sql(wh.con, f"{pad}SELECT * FROM sqlite_scan('{outside}', 's')")
    with open_readonly(lake) as wh, pytest.raises(ReadOnlyQueryError, match="sqlite_scan"):
        run_readonly(wh, f"{pad}SELECT 'é', * FROM sqlite_scan('{outside}', 's')")


def test_non_ascii_text_deletes_no_files(lake, orphan: Path):
    query = "SELECT 'é', * FROM ducklake_delete_orphaned_files('lake', cleanup_all => true)"
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError, match="delete_orphaned"):
        run_user_sql(wh.con, query)
    with open_readonly(lake) as wh, pytest.raises(ReadOnlyQueryError, match="delete_orphaned"):
        run_readonly(wh, query)
    assert orphan.exists()


def test_write_statements_are_checked_on_byte_correct_tokens(lake, outside):
    with open_sandboxed(lake, write=True) as wh:
        for q in (
            f"INSERT INTO pins SELECT x, 1, 'é', now() FROM /* é */ sqlite_scan('{outside}', 's')",
            "INSERT INTO pins SELECT 'é', 1, path, now() FROM duckdb_databases()",
            "INSERT INTO pins SELECT 'é', 1, path, now() FROM duckdb_databases",
            "UPDATE pins SET note = (SELECT current_setting('allowed_directories'))",
        ):
            with pytest.raises(SqlRefusedError, match="refusing"):
                run_user_sql(wh.con, q, write=True)
        assert run_user_sql(wh.con, "SELECT count(*) FROM pins")[0].item() == 0


# -- finding 2: EXPLAIN ANALYSE and friends write nothing ---------------------------------------


@pytest.mark.parametrize("verb", ["EXPLAIN ANALYSE", "EXPLAIN ANALYZE", "explain   analyse"])
def test_explain_analyse_writes_no_file(lake, verb: str):
    target = Path(lake.data_path) / "evil.csv"
    query = f"{verb} COPY (SELECT 'x') TO '{target}'"
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError, match="EXPLAIN ANALYZE"):
        run_user_sql(wh.con, query)
    with open_readonly(lake) as wh, pytest.raises(ReadOnlyQueryError, match="EXPLAIN ANALYZE"):
        run_readonly(wh, query)
    assert not target.exists()


def test_plain_explain_of_a_select_runs(lake):
    with open_readonly(lake) as wh:
        plan = run_readonly(wh, "EXPLAIN SELECT count(*) FROM steps")
    assert plan.frame.height >= 1 and "explain_value" in plan.frame.columns


# -- finding 3: no query sees what another left behind ------------------------------------------


def test_every_dashboard_query_runs_on_a_fresh_connection(lake):
    with open_readonly(lake) as wh:
        with pytest.raises(ReadOnlyQueryError, match="EXPLAIN ANALYZE"):
            run_readonly(
                wh, "EXPLAIN ANALYZE CREATE TEMP VIEW tasks AS SELECT 'spoofed' AS task_id"
            )
        # even an object on the shared connection itself is not what a user query reads
        wh.con.execute("CREATE TEMP VIEW tasks AS SELECT 'spoofed' AS task_id")
        got = run_readonly(wh, "SELECT task_id FROM tasks ORDER BY 1").frame["task_id"].to_list()
    assert len(got) == 3 and "spoofed" not in got


# -- finding 4: the catalog password is in no readable place ------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "SELECT path FROM duckdb_databases()",
        "SELECT * FROM duckdb_settings()",
        "PRAGMA database_list",
        "SELECT * FROM pragma_database_list",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM __ducklake_metadata_lake.ducklake_metadata",
        "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
        "SELECT * FROM postgres_scan('host=127.0.0.1 port=9 dbname=x', 'public', 't')",
        "SELECT current_setting('allowed_directories')",
    ],
)
def test_catalog_internals_are_not_readable(lake, query: str):
    with open_sandboxed(lake) as wh, pytest.raises(SqlRefusedError):
        run_user_sql(wh.con, query)


@pytest.mark.postgres
def test_the_postgresql_password_is_a_secret_not_an_attach_string(pg_url: str, tmp_path: Path):
    password = "pw-Zq81xk"
    url = pg_url.replace("postgres@", f"postgres:{password}@")  # trust auth ignores it
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse=url)
    assert password not in cfg.catalog and cfg.secret == password
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=2, n_tasks=2, samples=1))
    con = connect(cfg, read_only=True, sandboxed=True)
    try:  # even unchecked SQL on the connection finds no password
        seen = con.execute("SELECT string_agg(path, ' ') FROM duckdb_databases()").fetchone()[0]
        settings = con.execute("SELECT string_agg(value, ' ') FROM duckdb_settings()").fetchone()
        secrets = con.execute("SELECT string_agg(secret_string, ' ') FROM duckdb_secrets()")
        assert "dbname=" in seen and password not in seen
        assert password not in str(settings) and password not in str(secrets.fetchone())
    finally:
        con.close()
    with open_sandboxed(cfg) as wh:
        assert run_user_sql(wh.con, "SELECT count(*) FROM tasks")[0].item() == 2


# -- a time limit that interrupts DuckDB --------------------------------------------------------


def test_a_query_past_its_time_limit_is_interrupted(lake):
    with open_sandboxed(lake) as wh:
        start = time.monotonic()
        with pytest.raises(SqlTimeoutError, match=r"time limit of 0\.5 s"):
            run_user_sql(
                wh.con,
                "SELECT count(*) FROM range(100000000000) t(a) WHERE a % 7 = 3",
                timeout_s=0.5,
            )
        assert time.monotonic() - start < 10
        assert run_user_sql(wh.con, "SELECT count(*) FROM tasks")[0].item() == 3  # still usable


# -- finding 11: --write takes data statements; --schema and rollback ---------------------------


def test_schema_changes_need_schema_and_rollback_undoes_them(tmp_path: Path):
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=4, n_tasks=2, samples=2))
    with open_sandboxed(cfg, write=True) as wh:
        with pytest.raises(SqlRefusedError, match="--schema"):
            run_user_sql(wh.con, "DROP SCHEMA main CASCADE", write=True)
        counts = run_user_sql(
            wh.con, "SELECT (SELECT count(*) FROM steps) s, (SELECT count(*) FROM tasks) t"
        )[0].row(0)
        before = wh.sql("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").item()
        run_user_sql(wh.con, "DELETE FROM steps WHERE step_idx > 0", write=True)
        run_user_sql(wh.con, "DROP SCHEMA main CASCADE", write=True, schema=True)
    with Warehouse.open(cfg, migrate=False) as wh:
        report = rollback(wh, before)
        assert report.target == before and report.snapshot == report.previous + 1
        assert {t.action for t in report.tables} == {"recreated"}
    with open_sandboxed(cfg) as wh:
        again = run_user_sql(
            wh.con, "SELECT (SELECT count(*) FROM steps) s, (SELECT count(*) FROM tasks) t"
        )[0].row(0)
    assert again == counts and counts[0] > counts[1] > 0
    with Warehouse.open(cfg, migrate=False) as wh, pytest.raises(Exception, match="latest"):
        rollback(wh, wh.sql("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").item())


def test_rollback_of_a_data_change_keeps_the_tables(tmp_path: Path):
    cfg = WarehouseConfig.from_env(home=tmp_path / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        sample.load(wh, sample.generate(seed=5, n_tasks=2, samples=1))
        before = wh.sql("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").item()
        n = wh.sql("SELECT count(*) FROM trajectories").item()
        wh.con.execute("DELETE FROM trajectories")
        wh.con.execute("INSERT INTO pins VALUES ('oops', 1, 'x', now())")
        report = rollback(wh, before)
        assert {(t.table, t.action) for t in report.tables} == {
            ("trajectories", "rows"),
            ("pins", "rows"),
        }
        assert wh.sql("SELECT count(*) FROM trajectories").item() == n
        assert wh.sql("SELECT count(*) FROM pins").item() == 0
        with pytest.raises(Exception, match="no snapshot 999"):
            rollback(wh, 999)


# -- the property: generated hostile SQL runs nothing outside the allow-list --------------------

_DANGEROUS = [
    "sqlite_scan('{outside}', 's')",
    "\"SQLITE_SCAN\"('{outside}', 's')",
    "sqlite_attach('{outside}')",
    "read_text('{outside}')",
    "read_blob('{outside}')",
    "read_csv('{outside}')",
    "glob('{data}*')",
    "ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "ducklake_expire_snapshots('lake', older_than => now())",
    "ducklake_merge_adjacent_files('lake')",
    "lake.merge_adjacent_files()",
    "query('SELECT * FROM sqlite_scan(''{outside}'', ''s'')')",
    "query_table('tasks')",
    "duckdb_databases()",
    "duckdb_settings()",
    "duckdb_secrets()",
    "postgres_query('x', 'SELECT 1')",
]
_STATEMENTS = [
    "SELECT * FROM {fn}",
    "SELECT (SELECT count(*) FROM {fn}) AS n FROM tasks",
    "WITH c AS (SELECT * FROM {fn}) SELECT * FROM c",
    "SELECT * FROM tasks WHERE task_id IN (SELECT * FROM {fn})",
    "EXPLAIN ANALYZE SELECT * FROM {fn}",
    "EXPLAIN ANALYSE COPY (SELECT 'x') TO '{data}evil.csv'",
    "COPY (SELECT * FROM {fn}) TO '{data}evil.csv'",
    "CREATE TEMP VIEW tasks AS SELECT * FROM {fn}",
    "ATTACH '{outside}' AS o",
    "SET enable_external_access = true",
    "PRAGMA database_list",
    "SELECT * FROM sqlite_master",
    "SELECT * FROM duckdb_databases",
]
_NOISE = st.text(alphabet=st.sampled_from([*"aé日ü x1_-'", "ß", "\u200b", "🙂"]), max_size=12)


@st.composite
def hostile_sql(draw) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        stmt = draw(st.sampled_from(_STATEMENTS)).replace("{fn}", draw(st.sampled_from(_DANGEROUS)))
        if draw(st.booleans()):
            stmt = stmt.upper() if draw(st.booleans()) else stmt.swapcase()
        noise = draw(_NOISE).replace("*/", "")
        comment = draw(st.sampled_from([f"/* {noise} */ ", f"-- {noise}\n", ""]))
        lead = draw(st.sampled_from(["", f"SELECT '{noise.replace(chr(39), '')}' AS n; "]))
        parts.append(lead + comment + stmt)
    return "; ".join(parts)


@given(hostile_sql())
def test_generated_hostile_sql_runs_nothing_outside_the_allow_list(lake, outside, query: str):
    data = Path(lake.data_path)
    query = query.replace("{outside}", str(outside)).replace("{data}", f"{data}/")
    before = _digest(data)
    with open_sandboxed(lake) as wh:
        try:
            frame, _ = run_user_sql(wh.con, query)
        except (SqlRefusedError, duckdb.ParserException) as exc:
            assert SECRET not in str(exc)
        else:  # it ran: then it read nothing outside and changed nothing
            assert frame is None or SECRET not in str(frame.rows())
        assert run_user_sql(wh.con, "SELECT count(*) FROM tasks")[0].item() == 3
    assert _digest(data) == before
    assert not (data / "evil.csv").exists()


# -- the CLI path -------------------------------------------------------------------------------


def _webloop(home: Path, *args: str, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
    env.pop("WEBLOOP_WAREHOUSE", None)
    cmd = [sys.executable, "-m", "cli.app", *args]
    if kw.get("background"):
        return subprocess.Popen(  # SIGINT as a terminal sends it (a test runner may ignore it)
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # CLI subprocesses
def test_cli_sql_refuses_the_bypasses_and_rolls_back(tmp_path: Path, outside: Path):
    home = tmp_path / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        sample.load(wh, sample.generate(seed=6, n_tasks=2, samples=1))
    proc = _webloop(home, "sql", f"/* é */ SELECT * FROM sqlite_scan('{outside}','s')")
    assert proc.returncode == 2 and SECRET not in proc.stdout + proc.stderr
    assert "refusing to call sqlite_scan" in proc.stderr
    proc = _webloop(home, "sql", "--write", "DROP SCHEMA main CASCADE")
    assert proc.returncode == 2 and "--schema" in proc.stderr, proc.stderr
    proc = _webloop(home, "sql", "--write", "--schema", "DROP SCHEMA main CASCADE")
    assert proc.returncode == 0, proc.stderr
    undo = proc.stdout.strip().splitlines()[-1]
    assert undo.startswith("snapshot ") and "webloop warehouse rollback" in undo
    snapshot = undo.rsplit(" ", 1)[-1]
    assert _webloop(home, "sql", "SELECT count(*) FROM tasks").returncode == 2  # gone
    proc = _webloop(home, "warehouse", "rollback", snapshot)
    assert proc.returncode == 0 and "tasks  recreated: None -> 2 rows" in proc.stdout, proc.stdout
    proc = _webloop(home, "sql", "SELECT count(*) AS n FROM tasks", "--format", "json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == [{"n": 2}]


@pytest.mark.parametrize(
    "exc", [RuntimeError("Query interrupted"), duckdb.InterruptException("INTERRUPT Error")]
)
def test_a_ctrl_c_while_the_query_is_checked_is_an_interruption_too(lake, monkeypatch, exc):
    """Ctrl-C can land before the query's own statements: while it is checked (DuckDB calls of
    their own, slow on a loaded machine) DuckDB interrupts them with a RuntimeError (seen once
    in the CLI test below: "webloop sql failed: RuntimeError: Query interrupted")."""
    from warehouse import usersql

    def interrupted(*_a, **_k):
        raise exc

    monkeypatch.setattr(usersql, "check_user_sql", interrupted)
    with open_sandboxed(lake) as wh, pytest.raises(SqlInterruptedError, match="was stopped"):
        run_user_sql(wh.con, "SELECT 1")
    monkeypatch.setattr(
        usersql,
        "check_user_sql",
        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("Catalog Error: no such table")),
    )
    with open_sandboxed(lake) as wh, pytest.raises(RuntimeError, match="no such table"):
        run_user_sql(wh.con, "SELECT 1")  # other errors stay what they are


@pytest.mark.slow  # a CLI subprocess and a signal
def test_cli_sql_stops_at_ctrl_c(lake):
    proc = _webloop(
        lake.home,
        "sql",
        SLOW,
        background=True,
    )
    try:
        notice = proc.stderr.readline()  # printed once the query has run for 2 s
        assert b"still running after 2 s (Ctrl-C stops it" in notice, notice
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a query that was not stopped would run for hours
    assert time.monotonic() - sent < 10
    assert proc.returncode == 130 and err.strip() == b"interrupted: the query was stopped", err
