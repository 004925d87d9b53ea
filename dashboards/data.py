"""Cached access to the warehouse for the pages (Streamlit caches over :mod:`dashboards.queries`).

One warehouse connection per process (``st.cache_resource``); every query and every label
write runs on its own cursor of it, so sessions on different threads never share a
transaction. Results are
cached (``st.cache_data``) keyed by the query, its arguments and the warehouse's current
DuckLake snapshot: a page shows what flows wrote as soon as they commit, and a rerun over an
unchanged warehouse costs one snapshot lookup. Label writes need no cache clearing (the
write makes a new snapshot). The SQL page runs on a separate sandboxed, read-only connection
(:mod:`warehouse.readonly`), a fresh cursor of it per query.

The warehouse is the one of ``WEBLOOP_HOME`` / ``WEBLOOP_WAREHOUSE`` (``webloop dashboard``
passes them through).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import duckdb
import streamlit as st

from dashboards import queries
from dashboards.marker import draw_action
from warehouse.config import WarehouseConfig
from warehouse.connection import LAKE, require_catalog_file
from warehouse.readonly import QueryResult, open_readonly, run_readonly
from warehouse.retry import retrying
from warehouse.store import Warehouse

_write_lock = threading.Lock()


def config() -> WarehouseConfig:
    return WarehouseConfig.from_env()


def _key(cfg: WarehouseConfig) -> str:
    return f"{cfg.describe()}|{cfg.data_path}|{cfg.blob_path}"


@st.cache_resource(show_spinner=False)
def _reader(key: str) -> Warehouse:
    """The process's one warehouse connection, for reads and label writes (each on its own
    cursor). A read-only probe first: it raises NoWarehouseError, creating nothing, when there
    is no warehouse yet (errors are not cached, so a warehouse created later is found on the
    next rerun).

    One connection, opened once, on purpose: opening the warehouse writable runs a Python
    ``sqlite3`` open/close of a SQLite catalog (``warehouse.connection._prepare_sqlite``), and
    closing that handle drops the POSIX locks DuckDB's SQLite holds on the same file in this
    process; a reader then saw "disk I/O error" / "database disk image is malformed" while
    another process committed. Likewise a READ_ONLY attachment failed with "disk I/O error".
    """
    cfg = config()
    if cfg.catalog_kind == "sqlite":
        require_catalog_file(cfg)  # the file check is the probe (a full open costs ~0.5 s)
    else:
        Warehouse.open(cfg, migrate=False, read_only=True).close()
    return Warehouse.open(cfg, migrate=False)


def _io_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and "disk I/O error" in str(exc)


_io_retry = retrying(attempts=8, retry_on=_io_error, base_delay=0.05, max_delay=0.5)


@st.cache_resource(show_spinner=False)
def _sandboxed(key: str) -> Warehouse:
    return open_readonly(config())


@contextlib.contextmanager
def reading() -> Iterator[Warehouse]:
    """A warehouse on a fresh cursor of the shared read-only connection."""
    cfg = config()
    base = _reader(_key(cfg))
    cur = base.con.cursor()
    try:
        cur.execute(f"USE {LAKE}")
        yield Warehouse(cfg, cur)
    finally:
        cur.close()


_SNAPSHOT_TTL_S = 1.0
_snapshots: dict[str, tuple[float, int]] = {}


def snapshot() -> int:
    """The warehouse's current snapshot id: the cache key that makes results live. Looked up
    at most once a second per warehouse (a page asks for it once per query it shows)."""
    key = _key(config())
    now = time.monotonic()
    hit = _snapshots.get(key)
    if hit is not None and now - hit[0] < _SNAPSHOT_TTL_S:
        return hit[1]

    def lookup() -> int:
        with reading() as wh:
            return int(wh.sql(f"SELECT max(snapshot_id) FROM {LAKE}.snapshots()").item())

    snap = _io_retry(lookup)
    _snapshots[key] = (now, snap)
    return snap


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(name: str, snap: int, key: str, args: tuple[Any, ...]) -> Any:
    def run() -> Any:
        with reading() as wh:
            return getattr(queries, name)(wh, *args)

    return _io_retry(run)


def get(name: str, *args: Any) -> Any:
    """``queries.<name>(wh, *args)`` at the current snapshot, cached."""
    return _cached(name, snapshot(), _key(config()), args)


@st.cache_data(show_spinner=False, max_entries=256)
def _image(
    digest: str | None,
    action_json: str | None,
    box: tuple[float, ...] | None,
    norm1000: bool,
    key: str,
) -> tuple[bytes | None, str]:
    import json

    with reading() as wh:
        png, why = queries.screenshot(wh, digest)
    if png is None:
        return None, why or "no screenshot"
    action = json.loads(action_json) if action_json else None
    try:
        return draw_action(png, action, box=box, norm1000=norm1000)
    except ValueError as exc:
        return None, str(exc)


def annotated_screenshot(
    digest: str | None, action_json: str | None, box: tuple[float, ...] | None, norm1000: bool
) -> tuple[bytes | None, str]:
    """(PNG with the action drawn, description) or (None, why there is no image)."""
    return _image(digest, action_json, box, norm1000, _key(config()))


def raw_screenshot(digest: str | None) -> tuple[bytes | None, str | None]:
    with reading() as wh:
        return queries.screenshot(wh, digest)


@st.cache_data(show_spinner=False, max_entries=1024)
def _element_box(a11y_hash: str | None, ref: str | None, key: str) -> tuple[float, ...] | None:
    with reading() as wh:
        return queries.element_box(wh, a11y_hash, ref)


def element_box(a11y_hash: str | None, ref: str | None) -> tuple[float, ...] | None:
    """The element's box from the stored accessibility snapshot (blobs never change: cached)."""
    return _element_box(a11y_hash, ref, _key(config()))


def save_label(traj_id: str, label: str, reviewer: str, **kw: Any) -> Any:
    """Write a label through the warehouse API (see :func:`queries.save_label`)."""
    cfg = config()
    with _write_lock:
        base = _reader(_key(cfg))
        cur = base.con.cursor()
        try:
            cur.execute(f"USE {LAKE}")
            return queries.save_label(Warehouse(cfg, cur), traj_id, label, reviewer, **kw)
        finally:
            cur.close()


def user_query(query: str, max_rows: int) -> QueryResult:
    """Run SQL typed on the SQL page on the sandboxed read-only connection: each query on a
    fresh cursor of it (no user's query can leave anything another user's sees), checked
    against :mod:`warehouse.usersql`'s allow-list and stopped at its time limit."""
    return run_readonly(_sandboxed(_key(config())), query, max_rows=max_rows)
