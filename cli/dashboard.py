"""``webloop dashboard``: start the Streamlit review app (``dashboards/app.py``).

The app reads the warehouse of ``WEBLOOP_HOME`` / ``WEBLOOP_WAREHOUSE`` (and
``WEBLOOP_DATA_PATH`` / ``WEBLOOP_BLOBS``), passed through to the Streamlit process;
``--home`` sets ``WEBLOOP_HOME`` for it.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import ConfigError, console, err
from dashboards import access
from serving.children import run_child
from warehouse import WarehouseConfig

APP = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"
PASSED = ("WEBLOOP_HOME", "WEBLOOP_WAREHOUSE", "WEBLOOP_DATA_PATH", "WEBLOOP_BLOBS")


def is_loopback(address: str) -> bool:
    """Whether ``address`` (what ``--address`` names) listens on this machine only: a loopback
    IP (127.0.0.0/8, ``::1``) or ``localhost``. Every other name or address, ``0.0.0.0`` and
    ``::`` (every interface) included, can be reached from elsewhere."""
    name = address.strip().strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def dashboard_command(
    port: int,
    *,
    home: Path | None = None,
    address: str = "127.0.0.1",
    headless: bool = True,
    auth: bool = True,
    insecure_public: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """The ``streamlit run`` command line and environment that serve the app on ``port``.

    ``auth``: the app requires an access token (:mod:`dashboards.access`): the environment's
    ``WEBLOOP_DASHBOARD_TOKEN``, else a new random one, in the returned environment. Without
    it, an address other than loopback (:func:`is_loopback`) is a :class:`ConfigError` unless
    ``insecure_public``: anyone who reaches the port would read the warehouse and label it."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: a TCP port is 1-65535")
    if not auth and not insecure_public and not is_loopback(address):
        raise ConfigError(
            f"--no-auth with --address {address} serves the warehouse without a token to "
            "anyone who can reach this machine: keep the token (drop --no-auth), listen on "
            "127.0.0.1, or pass --insecure-public to do it anyway"
        )
    env = dict(os.environ)
    if home is not None:
        env["WEBLOOP_HOME"] = str(home.expanduser().absolute())
    if auth:
        env[access.TOKEN_ENV] = env.get(access.TOKEN_ENV) or secrets.token_urlsafe(24)
    else:
        env.pop(access.TOKEN_ENV, None)
    env[access.REVIEWER_ENV] = access.default_reviewer()
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    argv = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
    ]
    return argv, env


def port_free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def register(app: typer.Typer) -> None:
    """Add ``webloop dashboard`` to the ``webloop`` app."""

    @app.command("dashboard")
    def dashboard(
        port: Annotated[
            int, typer.Option(help="Port to serve the app on.", min=1, max=65535)
        ] = 8501,
        home: Annotated[
            Path | None,
            typer.Option(help="Data directory (default $WEBLOOP_HOME or ./.webloop)."),
        ] = None,
        address: Annotated[
            str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")
        ] = "127.0.0.1",
        open_browser: Annotated[
            bool, typer.Option("--open/--no-open", help="Open a browser tab.")
        ] = False,
        auth: Annotated[
            bool,
            typer.Option(
                "--auth/--no-auth",
                help="Require the access token printed in the URL (WEBLOOP_DASHBOARD_TOKEN "
                "fixes it; default: a new one each start).",
            ),
        ] = True,
        insecure_public: Annotated[
            bool,
            typer.Option(
                "--insecure-public",
                help="Allow --no-auth on an address other than loopback (anyone who reaches "
                "the port reads the warehouse).",
            ),
        ] = False,
    ) -> None:
        """Start the review app: trajectories step by step, labels, groups, judges, datasets,
        training and evaluations, read-only SQL."""
        argv, env = dashboard_command(
            port,
            home=home,
            address=address,
            headless=not open_browser,
            auth=auth,
            insecure_public=insecure_public,
        )
        if not auth and not is_loopback(address):  # --insecure-public: said, once more
            err.print(
                f"warning: no access token on {address}: anyone who reaches port {port} reads "
                "the warehouse",
                markup=False,
                highlight=False,
            )
        if not port_free(port, address):
            raise ConfigError(f"port {port} on {address} is in use: choose another with --port")
        shown = WarehouseConfig.from_env(home=env.get("WEBLOOP_HOME")).describe()  # no password
        token = env.get(access.TOKEN_ENV)
        url = f"http://{address}:{port}/" + (f"?token={token}" if token else "")
        console.print(f"webloop dashboard on {url} (warehouse: {shown})")
        code = run_child(argv, env=env)  # stops Streamlit on Ctrl-C, SIGTERM, SIGHUP, SIGKILL
        raise typer.Exit(0 if code == 128 + signal.SIGINT else code)
