"""Serve an ASGI app on a free loopback port from a background thread (for local model servers
in tests and benchmarks: a real HTTP server, no network beyond 127.0.0.1)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class ThreadedServer:
    """``with ThreadedServer(app) as s: s.url`` — uvicorn on 127.0.0.1:<free port>."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread: threading.Thread | None = None

    def __enter__(self) -> ThreadedServer:
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the local server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)
