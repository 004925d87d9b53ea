"""One HTTP server process hosting every bundled site, each on its own loopback port (origin).

A single uvicorn server listens on one socket per site and dispatches by the port a request
arrived on. Start it in a background thread (tests, flows) or a child process (benchmarks, where
the browser and the server should not share one interpreter)::

    with SiteServer(seed=0) as server:
        server.url("shop")            # 'http://127.0.0.1:41234'
        server.secret                 # for the inspection endpoint

``webloop sites serve`` runs it in the foreground (the one command-line entry point).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from sites import mail, shop, travel, wiki
from sites.common import SiteContext, new_secret
from sites.content import generate

SITES: dict[str, Any] = {"shop": shop, "travel": travel, "wiki": wiki, "mail": mail}


def build_apps(seed: int, secret: str, slow_s: float) -> dict[str, Any]:
    content = generate(seed)
    apps = {}
    for name, module in SITES.items():
        ctx = SiteContext(
            name=name, content=content, secret=secret, new_state=module.new_state, slow_s=slow_s
        )
        apps[name] = module.build(ctx)
    return apps


class Dispatcher:
    """ASGI app routing each connection to the site bound to the port it arrived on."""

    def __init__(self, by_port: dict[int, Any]) -> None:
        self.by_port = by_port

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self.by_port[scope["server"][1]](scope, receive, send)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.set_inheritable(True)
    return sock


class SiteServer:
    """The bundled sites on loopback ports; a context manager that starts and stops them."""

    def __init__(
        self,
        seed: int = 0,
        host: str = "127.0.0.1",
        ports: dict[str, int] | None = None,
        secret: str | None = None,
        slow_s: float = 0.4,
        mode: str = "thread",
    ) -> None:
        if mode not in ("thread", "process"):
            raise ValueError("mode is 'thread' or 'process'")
        self.seed, self.host, self.slow_s, self.mode = seed, host, slow_s, mode
        self.secret = secret or new_secret()
        self._ports = dict(ports or {})
        self.urls: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._server: uvicorn.Server | None = None
        self._proc: mp.process.BaseProcess | None = None

    def url(self, site: str) -> str:
        """Origin of a site, e.g. ``http://127.0.0.1:41234``."""
        try:
            return self.urls[site]
        except KeyError:
            raise KeyError(f"unknown or stopped site {site!r}; sites: {sorted(SITES)}") from None

    def start(self) -> SiteServer:
        wanted = {name: self._ports.get(name, 0) for name in SITES}
        if self.mode == "thread":
            socks = {name: _bind(self.host, port) for name, port in wanted.items()}
            self._start_thread(socks)
            ports = {n: s.getsockname()[1] for n, s in socks.items()}
        else:
            ports = self._start_process(wanted)
        self.urls = {n: f"http://{self.host}:{port}" for n, port in ports.items()}
        return self

    def _start_thread(self, socks: dict[str, socket.socket]) -> None:
        self._server = _make_server(self.seed, self.secret, self.slow_s, socks)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": list(socks.values())},
            daemon=True,
            name="webloop-sites",
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the sites server did not start")
            time.sleep(0.01)

    def _start_process(self, wanted: dict[str, int]) -> dict[str, int]:
        """Start the server process and return the ports it bound.

        The child binds its own sockets (port 0 picks free ones) and reports the ports back:
        a port picked here and re-bound there could be taken by another process in between
        (a spawned interpreter takes seconds to start)."""
        ctx = mp.get_context("spawn")
        reply, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_serve_child,
            args=(self.seed, self.secret, self.slow_s, self.host, wanted, child_end, os.getpid()),
            daemon=True,
            name="webloop-sites",
        )
        self._proc.start()
        child_end.close()
        message = reply.recv() if reply.poll(60) else {"error": "no reply within 60 s"}
        reply.close()
        if "ports" not in message:
            self._proc.kill()
            self._proc.join(timeout=10)
            self._proc = None
            raise RuntimeError(f"the sites server process did not start: {message['error']}")
        return message["ports"]

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(timeout=10)
        self._server = self._thread = self._proc = None

    def __enter__(self) -> SiteServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


PARENT_POLL_S = 1.0
"""How often a server process checks that its parent still runs."""


def _make_server(
    seed: int, secret: str, slow_s: float, socks: dict[str, socket.socket]
) -> uvicorn.Server:
    apps = build_apps(seed, secret, slow_s)
    by_port = {s.getsockname()[1]: apps[name] for name, s in socks.items()}
    config = uvicorn.Config(
        Dispatcher(by_port),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )
    return uvicorn.Server(config)


def _serve_child(
    seed: int,
    secret: str,
    slow_s: float,
    host: str,
    ports: dict[str, int],
    reply: Any,
    parent: int,
) -> None:
    """The server process. It exits when its parent is gone: a parent killed by a signal runs
    no exit handlers, and its daemon children would otherwise keep serving (and hold ports).

    A terminal's Ctrl-C reaches the whole process group: the parent decides when this process
    stops, so the child ignores SIGINT before it serves, and uvicorn (which handles SIGINT while
    serving, then raises it again once shut down) ends quietly instead of with a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        socks = {name: _bind(host, port) for name, port in ports.items()}
        server = _make_server(seed, secret, slow_s, socks)
    except Exception as exc:  # reported to the parent, which raises it with the cause
        reply.send({"error": f"{type(exc).__name__}: {exc} (host {host}, ports {ports})"})
        return

    async def orphaned() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_POLL_S)
        server.should_exit = True

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=list(socks.values())))
        while not server.started:
            if task.done():
                reply.send({"error": f"uvicorn stopped while starting: {task.exception()!r}"})
                return
            await asyncio.sleep(0.01)
        reply.send({"ports": {n: s.getsockname()[1] for n, s in socks.items()}})
        watch = asyncio.create_task(orphaned())
        await task
        watch.cancel()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
