"""Prefect settings for running offline, set before prefect is imported.

- No analytics (no network here), no empty ``PREFECT_API_URL`` (an empty string breaks the
  client; unset means "start a temporary local server").
- A longer start-up timeout for that temporary server: the first start with a fresh
  ``PREFECT_HOME`` takes 13-16 s on 2 cores.
- Logs: Prefect's warnings and errors go to webloop's log file (:mod:`stages.logfile`).

:func:`configure` runs once, when the ``flows`` package is first imported (that is, where a flow
is about to run): the CLI imports ``flows`` only in the commands that run flows, so the others
never import Prefect.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from stages.logfile import LogFileHandler

_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}


def configure() -> None:
    """Apply webloop's Prefect defaults (explicit environment settings win), then import
    prefect (which sets up its logging) and add the log-file handler."""
    if os.environ.get("PREFECT_API_URL", None) == "":
        del os.environ["PREFECT_API_URL"]
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)
    import prefect  # noqa: F401  (its logging set-up replaces the root handlers: add ours after)

    root = logging.getLogger()
    if not any(isinstance(h, LogFileHandler) for h in root.handlers):
        root.addHandler(LogFileHandler(logging.WARNING))


def detach_temporary_server() -> None:
    """For a command's main thread, before its flow runs: start Prefect's temporary server (the
    one used when no ``PREFECT_API_URL`` is set) in a session of its own. A terminal's Ctrl-C
    goes to the command's whole process group; a temporary server in that group stops with it,
    and Prefect then spends over a minute retrying it (and prints its unsent events) before the
    command can exit. Detached, the server lives until the command has recorded the interruption;
    it still ends with the command: stopped at exit, and (``PR_SET_PDEATHSIG``) when the command
    dies otherwise. A no-op with a server configured or already running, or off the main thread
    (the kernel ties the parent-death signal to the thread that starts the server)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    if None in SubprocessASGIServer._instances:  # the process's temporary server exists
        return
    _detached_server_class()().start()  # Prefect's flows find it as the temporary server


def _detached_server_class() -> type:
    import subprocess
    import types

    import prefect.server.api.server as server_module
    from prefect.server.api.server import SubprocessASGIServer

    from serving.children import die_with_parent

    def popen(*args: object, **kwargs: object) -> subprocess.Popen:
        return subprocess.Popen(  # type: ignore[call-overload]
            *args, start_new_session=True, preexec_fn=die_with_parent, **kwargs
        )

    class DetachedServer(SubprocessASGIServer):
        """Prefect's temporary server, started in a session of its own."""

        def _run_uvicorn_command(self) -> subprocess.Popen:
            # Prefect's own command line, with the module's ``subprocess`` seen as one whose
            # Popen detaches (only for this call, only in that module)
            server_module.subprocess = types.SimpleNamespace(Popen=popen)  # type: ignore[assignment]
            try:
                return super()._run_uvicorn_command()
            finally:
                server_module.subprocess = subprocess

    return DetachedServer


_PROGRESS: dict[str, Callable[..., None]] = {}


@contextmanager
def progress_to(flow_name: str, fn: Callable[..., None] | None) -> Iterator[None]:
    """Hand a progress callback to a flow's tasks for the duration of one run (callables cannot
    be Prefect parameters; tasks run in this process and read it with :func:`progress_of`)."""
    if fn is not None:
        _PROGRESS[flow_name] = fn
    try:
        yield
    finally:
        _PROGRESS.pop(flow_name, None)


def progress_of(flow_name: str) -> Callable[..., None] | None:
    return _PROGRESS.get(flow_name)
