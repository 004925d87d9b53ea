"""The webloop CLI against a real warehouse: in-process through its console entry point (the
session's Prefect server for commands that run flows), plus real subprocesses where the process
itself is the subject (entry point, exit codes, a long-running server, signals)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import duckdb
import pytest

from tests.cli.cli_runner import webloop, webloop_subprocess
from warehouse import Warehouse, WarehouseConfig, migrations, sample


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    h = tmp_path_factory.mktemp("cli") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        sample.load(wh, sample.generate(seed=1, n_tasks=4, samples=2))
    return h


def test_sql_formats(home: Path):
    out = webloop(
        home, "sql", "SELECT task_id, site FROM tasks ORDER BY task_id", "--format", "csv"
    ).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["site"] for r in rows] == ["mail", "shop", "travel", "wiki"]
    out = webloop(home, "sql", "SELECT count(*) AS n FROM steps", "--format", "json").stdout
    n = json.loads(out)[0]["n"]
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        assert n == wh.sql("SELECT count(*) FROM steps").item() > 0
    table = webloop(home, "sql", "SELECT 'hello' AS greeting").stdout
    assert "greeting" in table and "hello" in table


def test_sql_refuses_writes_without_the_flag(home: Path):
    proc = webloop(home, "sql", "DELETE FROM steps", ok=False)
    assert proc.returncode == 2
    assert "refusing to run a DELETE statement: this SQL is read-only (pass --write)" in proc.stderr
    proc = webloop(home, "sql", "SELECT 1; DROP TABLE steps", ok=False)
    assert proc.returncode == 2 and "DROP" in proc.stderr
    n = json.loads(
        webloop(home, "sql", "SELECT count(*) AS n FROM steps", "--format", "json").stdout
    )[0]["n"]
    assert n > 0  # nothing was deleted


def test_sql_with_write_changes_data(home: Path):
    webloop(home, "sql", "INSERT INTO pins VALUES ('p-cli', 1, 'from cli', now())", "--write")
    out = webloop(
        home, "sql", "SELECT reason FROM pins WHERE pin_id = 'p-cli'", "--format", "json"
    ).stdout
    assert json.loads(out) == [{"reason": "from cli"}]


def test_sql_errors_are_one_line_without_traceback(home: Path):
    proc = webloop(home, "sql", "SELECT nope FROM steps", ok=False)
    assert proc.returncode == 2 and "nope" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # a fresh interpreter imports the CLI
def test_the_console_entry_point_as_a_subprocess(home: Path):
    """The real process: help exits 0, a user error exits 2 with an error message and no
    traceback, a query prints its rows."""
    proc = webloop_subprocess(home, "--help")
    assert "collect" in proc.stdout and "score-steps" in proc.stdout
    proc = webloop_subprocess(home, "sql", "SELECT nope FROM steps", ok=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # (on a loaded machine a "still running after 2 s" progress line may come first)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nope" in errors[0], proc.stderr
    assert proc.stderr.splitlines()[-1] == errors[0]  # the error is what it ends with
    out = webloop_subprocess(home, "sql", "SELECT count(*) AS n FROM tasks", "--format", "json")
    assert json.loads(out.stdout) == [{"n": 4}]


def test_info_reports_counts(home: Path):
    info = json.loads(webloop(home, "warehouse", "info", "--format", "json").stdout)
    tables = {t["table"]: t["rows"] for t in info["tables"]}
    assert tables["tasks"] == 4 and tables["trajectories"] == 8
    assert info["schema_version"] == migrations.latest_version()
    assert info["blob_count"] == tables["blobs"]
    assert info["data_files"] > 0 and info["data_bytes"] > 0


def test_attach_sql_opens_the_warehouse_from_a_plain_duckdb(home: Path):
    script = webloop(home, "warehouse", "attach-sql").stdout
    lines = [ln for ln in script.splitlines() if ln and not ln.startswith("--")]
    from warehouse.connection import extension_directory

    con = duckdb.connect(
        config={"extension_directory": extension_directory(), "autoinstall_known_extensions": False}
    )
    for stmt in lines:
        con.execute(stmt)
    assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 8


def test_maintain_runs(home: Path):
    out = webloop(home, "warehouse", "maintain", "--keep-recent-minutes", "0").stdout
    assert "data files" in out and "expired" in out
    out = webloop(home, "sql", "SELECT count(*) AS n FROM trajectories", "--format", "json").stdout
    assert json.loads(out)[0]["n"] == 8


def test_import_and_export_om2w(home: Path, tmp_path: Path):
    run = json.loads(
        webloop(
            home, "sql", "SELECT run_id FROM runs WHERE kind = 'sample'", "--format", "json"
        ).stdout
    )[0]["run_id"]
    out = tmp_path / "om2w"
    assert (
        "wrote 8 task folder(s) (v2)"
        in webloop(home, "export", "om2w", str(out), "--run", run).stdout
    )
    assert all(
        json.loads(p.read_text())["schema_version"] == "online-mind2web-v2"
        for p in out.glob("*/result.json")
    )
    v1 = webloop(home, "export", "om2w", str(tmp_path / "v1"), "--run", run, "--schema", "v1")
    assert "wrote 8 task folder(s) (v1)" in v1.stdout
    assert "schema_version" not in next((tmp_path / "v1").glob("*/result.json")).read_text()
    (out / "broken").mkdir()
    proc = webloop(home, "import", "om2w", str(out), "--run", "reimported")
    assert "imported 8 trajectories" in proc.stdout
    assert "malformed broken: no result.json" in proc.stderr
    proc = webloop(home, "export", "om2w", str(tmp_path / "x"), "--run", "nope", ok=False)
    assert proc.returncode == 2 and "has no trajectories" in proc.stderr


def test_a_newer_warehouse_is_refused_with_a_clear_message(tmp_path: Path):
    h = tmp_path / "h"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        wh.con.execute("INSERT INTO webloop_schema VALUES (999, 'future', now())")
    proc = webloop(h, "sql", "SELECT 1", ok=False)
    assert proc.returncode == 2 and "schema version 999" in proc.stderr


def test_tasks_generate_list_and_import(tmp_path: Path):
    h = tmp_path / "h"
    out = webloop(h, "tasks", "generate", "--n", "120", "--seed", "3").stdout
    assert "120 tasks: 120 new" in out
    assert (
        "120 tasks: 0 new, 0 new versions, 120 unchanged"
        in webloop(h, "tasks", "generate", "--n", "120", "--seed", "3").stdout
    )
    rows = json.loads(
        webloop(
            h,
            "tasks",
            "list",
            "--site",
            "wiki",
            "--max-difficulty",
            "3",
            "--limit",
            "500",
            "--format",
            "json",
        ).stdout
    )
    assert rows and all(r["site"] == "wiki" and r["difficulty"] <= 3 for r in rows)
    ood = json.loads(
        webloop(h, "tasks", "list", "--split", "ood", "--limit", "500", "--format", "json").stdout
    )
    assert ood and {r["site"] for r in ood} == {"travel"}
    f = tmp_path / "wv.jsonl"
    f.write_text('{"web_name": "A", "id": 1, "ques": "Find X", "web": "https://a.b/"}\nnot json\n')
    proc = webloop(h, "tasks", "import", "webvoyager", str(f))
    assert "1 tasks read: 1 new" in proc.stdout
    assert f"{f}:2: not valid JSON" in proc.stderr
    proc = webloop(h, "tasks", "generate", "--suite", "other", ok=False)
    assert proc.returncode == 2 and "only the 'bundled' suite" in proc.stderr


@pytest.mark.slow  # a server process
def test_sites_serve_prints_urls_and_keeps_the_secret_private(tmp_path: Path):
    import signal

    import httpx

    from tests.sites.serve_process import serve_until_ready

    h = tmp_path / "h"
    proc, urls = serve_until_ready(h)
    try:
        assert set(urls) == {"shop", "travel", "wiki", "mail"}
        assert httpx.get(urls["wiki"] + "/").status_code == 200
        # written before the URLs are printed: there is nothing to wait for
        secret_file = h / "sites.secret"
        assert secret_file.read_text(), "sites serve wrote no secret file"
        assert secret_file.stat().st_mode & 0o077 == 0  # only the owner may read it
        r = httpx.get(
            urls["mail"] + "/__webloop/state?session=x",
            headers={"X-Webloop-Secret": secret_file.read_text()},
        )
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_judge_and_agreement_commands(prefect_harness, tmp_path: Path):
    from warehouse.records import HumanLabel, Task, Trajectory

    h = tmp_path / "h"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        wh.write([Task(task_id="a", suite="s", site="shop", instruction="i", start_url="u")])
        wh.write_trajectories(
            [
                Trajectory(traj_id=t, run_id="r", task_id="a", policy="p", status=st)
                for t, st in (("x", "success"), ("y", "failure"))
            ],
            [],
        )
        wh.write(
            [
                HumanLabel(label_id="1", traj_id="x", label="success", reviewer="me"),
                HumanLabel(label_id="2", traj_id="y", label="success", reviewer="me"),
            ]
        )
    out = webloop(h, "judge", "--judge", "programmatic").stdout
    assert "judged 2: failure 1, success 1; judge errors 0" in out
    assert "judged 0: no verdicts" in webloop(h, "judge").stdout  # the backlog is empty now
    rows = json.loads(
        webloop(
            h,
            "judge",
            "agreement",
            "--judge",
            "programmatic",
            "--reference",
            "human",
            "--format",
            "json",
        ).stdout
    )
    overall = next(r for r in rows if r["site"] == "(all)")
    assert overall["judge_version"] == "1"
    assert overall["n"] == 2 and overall["accuracy"] == 0.5 and overall["recall"] == 0.5
    proc = webloop(h, "judge", "--judge", "nope", ok=False)
    assert proc.returncode == 2 and "unknown judge" in proc.stderr
    proc = webloop(h, "judge", "--judge", "rubric_vlm", ok=False)
    assert proc.returncode == 2 and "needs --base-url and --model" in proc.stderr
    proc = webloop(h, "judge", "--judge", "ensemble", "--members", "programmatic", ok=False)
    assert proc.returncode == 2 and "at least two member judges" in proc.stderr
