"""Secret values kept out of everything webloop stores or logs.

The secrets a process holds come from its environment (API keys, tokens, passwords: variables
named ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``…) and from configuration (the
PostgreSQL catalog's password, :func:`register`). :func:`redact` replaces each of them, and the
password of any ``scheme://user:password@host`` URL, with ``***`` in a text;
:func:`redact_frame` does the same to every string column of a frame — the warehouse applies it
to every row it writes, so an error body that echoes a key (a model server's 401) or a run
config holding a URL with credentials never lands in a table.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # polars is imported where frames are redacted: the chat path stays light
    import polars as pl

MASK = "***"
MIN_LENGTH = 6  # shorter values ("1", "true") would mask ordinary text
_NAME = re.compile(
    r"(API_?KEY|TOKEN|SECRET|SECRET_ACCESS_KEY|PASSWORD|PASSWD|CREDENTIALS?)$|^PGPASSWORD$", re.I
)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")

_lock = threading.Lock()
_registered: set[str] = set()


def register(value: str | None) -> None:
    """Treat ``value`` (a password from a URL or file) as a secret from now on."""
    if value and len(value) >= MIN_LENGTH:
        with _lock:
            _registered.add(value)


def secret_values() -> list[str]:
    """The secrets known now, longest first (so a key containing another is masked whole)."""
    env = {v for k, v in os.environ.items() if _NAME.search(k) and v and len(v) >= MIN_LENGTH}
    with _lock:
        values = env | _registered
    return sorted(values, key=len, reverse=True)


def has_url_credentials(text: str) -> bool:
    """True when ``text`` holds a URL with a password (``http://user:pass@host``)."""
    return bool(_URL_PASSWORD.search(text))


def redact(text: str) -> str:
    """``text`` with every known secret and every URL password replaced by ``***``."""
    for value in secret_values():
        if value in text:
            text = text.replace(value, MASK)
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<3>", text) if "@" in text else text


def redact_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with :func:`redact` applied to its string columns (the same frame, unchanged,
    when no value holds a secret: the common case costs one regex scan per string column)."""
    import polars as pl

    columns = [c for c, t in frame.schema.items() if t == pl.String]
    if not columns or frame.is_empty():
        return frame
    pattern = "|".join([re.escape(v) for v in secret_values()] + [_URL_PASSWORD.pattern])
    hits = frame.select(pl.col(c).str.contains(pattern).fill_null(False).any() for c in columns)
    dirty = [c for c, hit in zip(columns, hits.row(0), strict=True) if hit]
    if not dirty:
        return frame
    return frame.with_columns(
        pl.col(c).map_elements(redact, return_dtype=pl.String, skip_nulls=True) for c in dirty
    )
