"""CLI failure handling: unknown choices are usage errors before any work starts; failures
print one line (exit 2 for usage / bad input, 1 for runtime failures) and the traceback goes to
the log file."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from cli import app as cli
from sites.secret_files import SecretFileError
from tests.cli.cli_runner import webloop
from warehouse import Warehouse, WarehouseConfig
from warehouse.blobs import BlobCorruptError, BlobError
from warehouse.config import ConfigError
from warehouse.connection import WarehouseError
from warehouse.migrations import SchemaTooNewError


class FlowCalled(AssertionError):
    pass


@pytest.fixture
def no_flows(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand-ins for the flow modules: a command that gets as far as its flow records it
    (and no Prefect import or server start happens)."""
    called: list[str] = []

    def fake(name: str):
        def run(*args, **kwargs):
            called.append(name)
            raise FlowCalled(name)

        return run

    for mod, names in {
        "flows.collect": ["collect"],
        "flows.judge": ["judge"],
        "flows.score_steps": ["score_steps"],
    }.items():
        m = types.ModuleType(mod)
        for n in names:
            setattr(m, n, fake(f"{mod}.{n}"))
        monkeypatch.setitem(sys.modules, mod, m)
    return called


@pytest.mark.parametrize(
    ("args", "option", "names"),
    [
        (["collect", "--policy", "gpt"], "--policy", ["expert", "hf", "openai", "random"]),
        (["collect", "--coords", "inches"], "--coords", ["pixels", "norm1000"]),
        (["collect", "--prompt-mode", "x"], "--prompt-mode", ["screenshot", "a11y", "both"]),
        (["judge", "--judge", "nope"], "--judge", ["ensemble", "programmatic", "rubric_vlm"]),
        (["judge", "--selection", "x"], "--selection", ["model", "heuristic"]),
        (["judge", "--rule", "most"], "--rule", ["unanimous", "majority", "threshold"]),
        (["judge", "--members", "programmatic,nope"], "--members", ["programmatic"]),
        (["score-steps", "--scorer", "prm9"], "--scorer", ["exact", "vlm"]),
        (["score-steps", "--policy", "gpt"], "--policy", ["expert", "random"]),
        (["sql", "SELECT 1", "--format", "xml"], "--format", ["table", "csv", "json"]),
        (["tasks", "list", "--format", "xml"], "--format", ["table", "csv", "json"]),
        (["warehouse", "info", "--format", "yaml"], "--format", ["table", "csv", "json"]),
    ],
)
def test_unknown_choices_are_usage_errors_before_any_work(
    tmp_path: Path, no_flows: list[str], args: list[str], option: str, names: list[str]
):
    home = tmp_path / "home"
    result = CliRunner().invoke(cli.app, args, env={"WEBLOOP_HOME": str(home), "COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert all(n in result.output for n in names), result.output
    assert no_flows == []  # no flow was reached
    assert not home.exists()  # nothing was opened or written: no warehouse, no run row


def test_known_choices_reach_the_flow(tmp_path: Path, no_flows: list[str]):
    env = {"WEBLOOP_HOME": str(tmp_path / "h")}
    args = ["collect", "--policy", "random", "--coords", "norm1000", "--prompt-mode", "a11y"]
    result = CliRunner().invoke(cli.app, args, env=env)
    assert isinstance(result.exception, FlowCalled) and no_flows == ["flows.collect.collect"]


# -- main(): one line, exit codes, the log file ------------------------------------------------


def run_main(home: Path, *args: str) -> tuple[int, str, str]:
    """``webloop ARGS`` through the console entry point, in this process."""
    res = webloop(home, *args, ok=False)
    return res.returncode, res.stdout, res.stderr


def test_a_runtime_failure_is_one_line_exit_1_with_the_traceback_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import warehouse.sandbox

    def broken_io(*args, **kwargs):
        raise duckdb.IOException("IO Error: Could not read file 'data/x.parquet'")

    monkeypatch.setattr(warehouse.sandbox, "open_sandboxed", broken_io)  # what `sql` opens
    home = tmp_path / "home"
    code, _, err = run_main(home, "sql", "SELECT 1")
    log = home / "logs" / "webloop.log"
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: webloop sql failed: IOException: IO Error: Could not read")
    assert f"full traceback in {log}" in err and "re-run the same command" in err
    text = log.read_text()
    assert "ERROR webloop sql" in text and "Traceback" in text and "broken_io" in text


def test_a_crash_inside_a_flow_is_exit_1(tmp_path: Path, no_flows: list[str], monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("Target page, context or browser has been closed\nCall log: ...")

    monkeypatch.setattr(sys.modules["flows.collect"], "collect", crash)
    code, out, err = run_main(tmp_path / "h", "collect", "--n-tasks", "1")
    assert code == 1 and "collect:" in out
    assert err.startswith("error: webloop collect failed: RuntimeError: Target page")
    assert "Call log" not in err and len(err.strip().splitlines()) == 1


def test_usage_errors_exit_2(tmp_path: Path):
    home = tmp_path / "home"
    Warehouse.open(WarehouseConfig.from_env(home=home)).close()
    code, _, err = run_main(home, "collect", "--policy", "gpt")
    assert code == 2 and "unknown policy 'gpt'" in err and "Traceback" not in err
    code, _, err = run_main(home, "sql", "SELEC 1")
    assert code == 2 and err.startswith("error:") and "syntax error" in err.lower()
    code, _, err = run_main(home, "sql", 'SELECT * FROM "t[bold]x"')
    assert code == 2 and "table named 't[bold]x'" in err  # not eaten as rich markup


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (cli.ConfigError("x"), 2),
        (ConfigError("bad WEBLOOP_WAREHOUSE"), 2),
        (SecretFileError("world-readable"), 2),
        (duckdb.ParserException("syntax error"), 2),
        (duckdb.BinderException("no column"), 2),
        (duckdb.CatalogException("no table"), 2),
        (duckdb.IOException("could not read"), 1),
        (duckdb.InternalException("boom"), 1),
        (BlobError("not a sha256 hex digest"), 2),
        (BlobCorruptError("hash mismatch"), 1),
        (WarehouseError("no tasks in suite 'x'"), 2),
        (SchemaTooNewError("schema version 999"), 2),
        (FileNotFoundError(2, "No such file", "tasks.json"), 2),
        (RuntimeError("browser crashed"), 1),
        (OSError(28, "No space left on device"), 1),
        (KeyError("traj"), 1),
    ],
)
def test_exit_code_policy(exc: BaseException, code: int):
    assert cli.exit_code(exc) == code


def test_a_warehouse_error_over_an_io_failure_is_a_runtime_failure():
    try:
        try:
            raise duckdb.IOException("disk I/O error")
        except duckdb.Error:
            raise WarehouseError("cannot open the warehouse catalog sqlite:x") from None
    except WarehouseError as exc:
        assert cli.exit_code(exc) == 1


def test_task_import_reports_rows_and_refuses_a_file_with_no_task(tmp_path: Path):
    home = tmp_path / "home"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"web_name": "A"}\nnot json\n')
    code, _, err = run_main(home, "tasks", "import", "webvoyager", str(bad))
    assert code == 2
    assert f"skipped {bad}:1: 'web' is missing or empty" in err
    assert f"skipped {bad}:2: not valid JSON" in err
    assert "no webvoyager task could be read" in err
    assert not (home / "lake").exists()  # refused before the warehouse was opened
    mixed = tmp_path / "mixed.json"
    mixed.write_text(
        json.dumps([{"ques": "q", "web": "https://a.example/"}, {"ques": "q2"}], indent=1)
    )
    code, out, err = run_main(home, "tasks", "import", "webvoyager", str(mixed))
    assert code == 0 and "1 tasks read: 1 new" in out and "1 row(s) skipped" in out
    assert f"skipped {mixed} entry 2: 'web' is missing" in err


def test_a_failure_inside_a_prefect_flow_is_one_line_without_prefect_noise(
    tmp_path: Path, prefect_subprocess_env: dict[str, str]
):
    """The real entry point in a subprocess, a real flow run: the flow fails on its input
    (an empty suite); stderr is one line naming the log, which holds the traceback."""
    import os
    import subprocess

    home = tmp_path / "home"
    env = {**prefect_subprocess_env, "WEBLOOP_HOME": str(home), "COLUMNS": "300"}
    env.pop("WEBLOOP_WAREHOUSE", None)
    env.pop("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.app", "collect", "--suite", "nope", "--n-tasks", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.getcwd(),
    )
    log = home / "logs" / "webloop.log"
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: no tasks in suite 'nope', split 'train'; full traceback in {log}"
    ]
    text = log.read_text()
    assert "Traceback" in text and "select_tasks" in text  # ours, and Prefect's log records
    assert "Flow run" in text or "Task run" in text


@pytest.mark.slow  # a fresh interpreter
def test_the_policy_check_does_not_import_torch():
    """``--policy`` is checked against the registered policy names; listing them must not load
    torch (1-2 s per command): the ranker builds its model class on first use."""
    import subprocess

    code = (
        "import sys\n"
        "from cli.common import _policies\n"
        "names = _policies()\n"
        "assert 'ranker' in names and 'expert' in names, names\n"
        "assert 'torch' not in sys.modules, 'listing the policies imported torch'\n"
        "from rollouts.ranker import RankerModel\n"
        "assert 'torch' in sys.modules and RankerModel.__module__ == 'rollouts.ranker'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
