"""``webloop dashboard``: the streamlit command line and environment it runs, and refusals."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from flows import cli_dashboard
from flows.cli_dashboard import APP, dashboard_command


def test_command_line_and_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WEBLOOP_WAREHOUSE", "postgresql://u@db:5432/lake")
    argv, env = dashboard_command(8599, home=tmp_path / "h")
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", str(APP)]
    assert APP.is_file() and APP.name == "app.py"
    opts = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert opts["--server.port"] == "8599"
    assert opts["--server.address"] == "127.0.0.1"
    assert opts["--server.headless"] == "true"
    assert env["WEBLOOP_HOME"] == str((tmp_path / "h").absolute())
    assert env["WEBLOOP_WAREHOUSE"] == "postgresql://u@db:5432/lake"  # passed through


def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def main() -> None:
        """webloop"""

    cli_dashboard.register(a)
    return a


def test_runs_streamlit_with_the_options(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        cli_dashboard, "run_child", lambda argv, env: calls.append((argv, env)) or 0
    )
    monkeypatch.setattr(cli_dashboard, "port_free", lambda port, address: True)
    res = CliRunner().invoke(app(), ["dashboard", "--port", "8600", "--home", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "http://127.0.0.1:8600" in res.output
    ((argv, env),) = calls
    assert argv[argv.index("--server.port") + 1] == "8600"
    assert env["WEBLOOP_HOME"] == str(tmp_path.absolute())


def test_a_busy_port_is_refused(monkeypatch):
    calls = []
    monkeypatch.setattr(cli_dashboard, "run_child", lambda argv, env: calls.append(argv))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app(), ["dashboard", "--port", str(port)])
    assert res.exit_code != 0 and not calls
    assert f"port {port} on 127.0.0.1 is in use" in str(res.exception)


def test_a_bad_port_is_refused():
    res = CliRunner().invoke(app(), ["dashboard", "--port", "70000"])
    assert res.exit_code != 0
    assert "a TCP port is 1-65535" in str(res.exception)
