"""``webloop dashboard``: the streamlit command line and environment it runs, and refusals."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import dashboard as cli_dashboard
from cli.dashboard import APP, dashboard_command
from warehouse.config import ConfigError


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
    ((argv, env),) = calls
    token = env["WEBLOOP_DASHBOARD_TOKEN"]
    assert len(token) >= 24 and f"http://127.0.0.1:8600/?token={token}" in res.output
    assert argv[argv.index("--server.port") + 1] == "8600"
    assert env["WEBLOOP_HOME"] == str(tmp_path.absolute())
    assert env["WEBLOOP_REVIEWER"]  # the OS user who started it
    res = CliRunner().invoke(app(), ["dashboard", "--port", "8600", "--no-auth"])
    assert "WEBLOOP_DASHBOARD_TOKEN" not in calls[1][1] and "token=" not in res.output
    monkeypatch.setenv("WEBLOOP_DASHBOARD_TOKEN", "fixed-token-of-the-team")
    CliRunner().invoke(app(), ["dashboard", "--port", "8600"])
    assert calls[2][1]["WEBLOOP_DASHBOARD_TOKEN"] == "fixed-token-of-the-team"


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


def test_no_auth_off_loopback_is_refused_unless_insecure_public(monkeypatch, tmp_path):
    """Through ``webloop`` itself (its one-line errors and exit codes): ``--no-auth`` on an
    address others can reach starts nothing and exits 2 with one line; on loopback, or with
    ``--insecure-public`` (said again on stderr), it starts."""
    from tests.cli.cli_runner import webloop

    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(
        cli_dashboard, "run_child", lambda argv, env: calls.append((argv, env)) or 0
    )
    monkeypatch.setattr(cli_dashboard, "port_free", lambda port, address: True)
    for address in ("0.0.0.0", "::", "192.168.1.20", "dashboards.example.com"):
        res = webloop(tmp_path, "dashboard", "--address", address, "--no-auth", ok=False)
        assert res.returncode == 2 and not calls, address
        assert res.stderr.strip().splitlines() == [
            f"error: --no-auth with --address {address} serves the warehouse without a token "
            "to anyone who can reach this machine: keep the token (drop --no-auth), listen on "
            "127.0.0.1, or pass --insecure-public to do it anyway"
        ]
    for address in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        webloop(tmp_path, "dashboard", "--address", address, "--no-auth")
    webloop(tmp_path, "dashboard", "--address", "0.0.0.0")  # with its token
    res = webloop(tmp_path, "dashboard", "--address", "0.0.0.0", "--no-auth", "--insecure-public")
    assert "warning: no access token on 0.0.0.0" in res.stderr
    started = [(argv[argv.index("--server.address") + 1], env) for argv, env in calls]
    assert [a for a, _ in started] == ["127.0.0.1", "127.0.0.2", "::1", "localhost"] + [
        "0.0.0.0"
    ] * 2
    assert ["WEBLOOP_DASHBOARD_TOKEN" in env for _, env in started] == [False] * 4 + [
        True,
        False,
    ]


def test_a_bad_port_is_refused():
    res = CliRunner().invoke(app(), ["dashboard", "--port", "70000"])
    assert res.exit_code == 2 and "'--port'" in res.output
    with pytest.raises(ConfigError, match="a TCP port is 1-65535"):
        dashboard_command(70000)


def test_the_app_refuses_a_session_without_the_token(open_page, monkeypatch):
    """With a token required, a session without it (or with another) sees a refusal and no
    data; with it, the page renders, and the label form names the reviewer."""
    monkeypatch.setenv("WEBLOOP_DASHBOARD_TOKEN", "tok-3f9a1c")
    monkeypatch.setenv("WEBLOOP_REVIEWER", "alice")
    for query in ({}, {"token": "wrong"}):
        at = open_page("overview", **query)
        assert [e.value for e in at.error] and "needs its access token" in at.error[0].value
        assert not at.metric and not at.dataframe
    at = open_page("overview", token="tok-3f9a1c")
    assert not at.error and {m.label for m in at.metric} >= {"Trajectories", "Success"}
    at = open_page("label", token="tok-3f9a1c")
    reviewers = [t.value for t in at.text_input if t.label == "Reviewer"]
    assert reviewers and set(reviewers) == {"alice"}
