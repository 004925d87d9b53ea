"""webloop's log file: warnings and errors of the libraries (Prefect's included) and the full
traceback of a failed command, so that a failure reaches the user as one line naming the file.

``$WEBLOOP_LOG``, else ``$WEBLOOP_HOME/logs/webloop.log``. Every text is masked for secrets
(:func:`warehouse.secrets.redact`) before it is written."""

from __future__ import annotations

import datetime as dt
import logging
import os
import traceback
from pathlib import Path

from warehouse.secrets import redact


def log_path() -> Path:
    """``$WEBLOOP_LOG``, else ``$WEBLOOP_HOME/logs/webloop.log`` (home default ``./.webloop``),
    resolved when a record is written (the CLI's ``--home`` sets ``WEBLOOP_HOME``)."""
    if os.environ.get("WEBLOOP_LOG"):
        return Path(os.environ["WEBLOOP_LOG"]).absolute()
    return Path(os.environ.get("WEBLOOP_HOME") or ".webloop").absolute() / "logs" / "webloop.log"


def _append(text: str) -> Path:
    text = redact(text)  # no API key, password or URL credential reaches the log file
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


def quiet_prefect_console() -> None:
    """For the CLI, before prefect is imported: Prefect's console handler shows only CRITICAL
    records (the rest goes to the log file); an explicit environment setting wins."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
