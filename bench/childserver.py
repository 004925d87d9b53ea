"""A benchmark's model server in a child process (like a real model server, not sharing the
benchmark's interpreter): ``python SCRIPT --serve PORT ARGS…``, ready when ``/stats`` answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

import httpx


class ChildServer:
    """Start ``script --serve PORT *args`` on a free loopback port; ``stats()`` reads /stats."""

    def __init__(self, script: str, *args: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + "/v1"
        self.proc = subprocess.Popen([sys.executable, script, "--serve", str(self.port), *args])

    def __enter__(self) -> ChildServer:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(self.base + "/stats", timeout=1)
                return self
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        self.proc.terminate()
        raise RuntimeError("the model server did not start")

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.base + "/stats", timeout=10).json()

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)
