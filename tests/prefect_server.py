"""The session's temporary Prefect server, started in the background when collection ends.

Prefect's ``prefect_test_harness`` starts a server subprocess (uvicorn over a fresh SQLite
database: 15-20 s on 2 cores) and waits for it in the calling thread, the first time a flow test
needs it. This does the same in two halves: :func:`launch` starts the server in a background
thread right after collection (it loads on the core the suite leaves idle), and :func:`harness`
(the ``prefect_harness`` fixture) enters the harness's settings around it: the temporary database,
the server's API URL, the server registered as the process's default ephemeral server (so no
flow starts a second one), the settings exposed process-wide. Mirrors
``prefect.testing.utilities.prefect_test_harness`` of the pinned Prefect (3.9).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any


class _Early:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="webloop-prefect-"))
        self.db_url = "sqlite+aiosqlite:///" + str(self.dir / "prefect-test.db")
        self.server: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._go, name="prefect-launch", daemon=True)

    def _go(self) -> None:
        try:
            import prefect.settings
            from prefect.server.api.server import SubprocessASGIServer

            settings = prefect.settings
            updates = {settings.PREFECT_SERVER_DATABASE_CONNECTION_URL: self.db_url}
            with settings.temporary_settings(updates=updates):  # the subprocess's environment
                self.server = SubprocessASGIServer(port=_free_port())
                self.server.start(timeout=300)  # a deadline for loaded machines
        except BaseException as exc:  # raised again by the fixture
            self.error = exc

    def wait(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_early: _Early | None = None


def launch() -> None:
    """Start the server now, in a background thread (once per session)."""
    global _early
    if _early is None:
        from flows import prefect_env

        prefect_env.configure()
        _early = _Early()
        _early.thread.start()


@contextmanager
def harness() -> Iterator[str]:
    """The harness around the launched server (launched now when it was not); its API URL.
    Under pytest-xdist, the server the controller launched for every worker
    (``tests/shared_services.py``)."""
    from tests import shared_services

    shared = shared_services.wait_for("prefect")
    if shared is not None:
        with _client_of(shared["api_url"]):
            yield shared["api_url"]
        return
    launch()
    assert _early is not None
    import prefect.context
    import prefect.settings
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.server.database.dependencies import temporary_database_interface

    settings = prefect.settings
    with ExitStack() as stack:
        stack.enter_context(temporary_database_interface())
        stack.enter_context(
            settings.temporary_settings(
                updates={settings.PREFECT_SERVER_DATABASE_CONNECTION_URL: _early.db_url}
            )
        )
        server = _early.wait()
        prior = SubprocessASGIServer._instances.get(None)
        SubprocessASGIServer._instances[None] = server
        stack.callback(_restore, SubprocessASGIServer, prior)
        stack.callback(server.stop)
        stack.enter_context(
            settings.temporary_settings(updates={settings.PREFECT_API_URL: server.api_url})
        )
        stack.enter_context(
            prefect.context._temporary_global_settings_context(
                prefect.context.get_settings_context()
            )
        )
        yield server.api_url
        _drain()  # the logs and events still queued, before the server stops
    shutil.rmtree(_early.dir, ignore_errors=True)


@contextmanager
def _client_of(api_url: str) -> Iterator[None]:
    """This process's flows talk to the server at ``api_url`` (another process owns it)."""
    from flows import prefect_env

    prefect_env.configure()
    import prefect.context
    import prefect.settings

    settings = prefect.settings
    with ExitStack() as stack:
        url = {settings.PREFECT_API_URL: api_url}
        stack.enter_context(settings.temporary_settings(updates=url))
        stack.enter_context(
            prefect.context._temporary_global_settings_context(
                prefect.context.get_settings_context()
            )
        )
        yield
        _drain()


def _drain() -> None:
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:  # the worker never started
            pass
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


def _restore(cls: Any, prior: Any) -> None:
    if prior is None:
        cls._instances.pop(None, None)
    else:
        cls._instances[None] = prior


def stop() -> None:
    """Stop a server that no test used (the session is over)."""
    if _early is not None and _early.server is not None and _early.server.running:
        _early.thread.join()
        _early.server.stop()
        shutil.rmtree(_early.dir, ignore_errors=True)
