"""Prefect settings for running offline, set before prefect is imported.

- No analytics (no network here), no empty ``PREFECT_API_URL`` (an empty string breaks the
  client; unset means "start a temporary local server").
- A longer start-up timeout for that temporary server: the first start with a fresh
  ``PREFECT_HOME`` takes 13-16 s on 2 cores.
- Logs: Prefect's warnings and errors (and a failed command's traceback, written by the CLI)
  go to ``$WEBLOOP_HOME/logs/webloop.log`` (``WEBLOOP_LOG`` overrides the path). The CLI also
  quiets Prefect's console handler (:func:`quiet_console`): a failure reaches the user as one
  line naming the log, not as Prefect's tracebacks.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


def quiet_console() -> None:
    """For the CLI, before prefect is imported: Prefect's console handler shows only CRITICAL
    records (the rest goes to the log file); an explicit environment setting wins."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def log_path() -> Path:
    """``$WEBLOOP_LOG``, else ``$WEBLOOP_HOME/logs/webloop.log`` (home default ``./.webloop``),
    resolved when a record is written (the CLI's ``--home`` sets ``WEBLOOP_HOME``)."""
    if os.environ.get("WEBLOOP_LOG"):
        return Path(os.environ["WEBLOOP_LOG"]).absolute()
    return Path(os.environ.get("WEBLOOP_HOME") or ".webloop").absolute() / "logs" / "webloop.log"


def _append(text: str) -> Path:
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    return path


class LogFileHandler(logging.Handler):
    """Appends records to :func:`log_path` (opened per record: only warnings and errors)."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _append(self.format(record))
        except Exception:
            self.handleError(record)


def log_exception(exc: BaseException, command: str) -> Path | None:
    """Write ``exc``'s full traceback to the log file; its path, or None if it cannot be
    written (a read-only home must not hide the original error)."""
    stamp = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    tb = "".join(traceback.format_exception(exc))
    try:
        return _append(f"{stamp} ERROR {command}\n{tb}")
    except OSError:
        return None


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
