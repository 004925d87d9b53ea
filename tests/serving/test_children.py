"""A command that starts a server child stops it however the command is stopped: SIGTERM (a
supervisor, ``docker stop``) and SIGKILL of ``webloop dashboard`` leave no Streamlit serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.slow  # real Streamlit servers


def _dashboard(home: Path, port: int) -> tuple[subprocess.Popen, psutil.Process]:
    """``webloop dashboard`` in its own process; returns it and its Streamlit child once the
    app answers its health check."""
    env = {**os.environ, "WEBLOOP_HOME": str(home), "WEBLOOP_WAREHOUSE": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).text == "ok":
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "streamlit did not start"
        time.sleep(0.3)
    (child,) = psutil.Process(proc.pid).children()
    return proc, child


def _gone(child: psutil.Process, port: int, within: float = 20) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not child.is_running() or child.status() == psutil.STATUS_ZOMBIE:
            try:
                httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
            except httpx.HTTPError:
                return True
        time.sleep(0.2)
    return False


def test_sigterm_to_the_dashboard_stops_streamlit(tmp_path: Path):
    port = free_port()
    proc, child = _dashboard(tmp_path / "home", port)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
        assert _gone(child, port)
    finally:
        if child.is_running():
            child.kill()


def test_sigkill_of_the_dashboard_takes_streamlit_along(tmp_path: Path):
    port = free_port()
    proc, child = _dashboard(tmp_path / "home", port)
    try:
        proc.kill()  # no Python runs: the kernel's parent-death signal stops the child
        proc.wait(30)
        assert _gone(child, port)
    finally:
        if child.is_running():
            child.kill()
