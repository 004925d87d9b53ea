"""DuckDB's extensions offline, their signatures checked once per process.

The ``duckdb-ext-*`` wheels ship DuckDB's signed extension binaries (ducklake, sqlite, postgres:
about 50 MB each; httpfs: 25 MB) under ``site-packages/duckdb_ext/extensions/``;
:func:`connect_config` points DuckDB there and never lets it download one.

DuckDB checks an extension's signature at every ``LOAD`` by hashing the whole binary, and every
warehouse open is a new in-memory DuckDB that loads ducklake and a catalog extension again:
measured here, connect + ``LOAD ducklake`` + ``LOAD sqlite`` took 0.45 s with the check and
0.02 s without it — most of what opening a warehouse cost, paid by every CLI command, flow task,
dashboard query and test. So the check runs once per process instead: :func:`verified` loads every
extension file of the folder in a throwaway connection with DuckDB's signature check on (a file
that fails it raises there, naming it), then remembers each file's identity (device, inode,
size, modification and change times). Later connections skip DuckDB's check
(``allow_unsigned_extensions``) only while the folder holds exactly the files verified, unchanged;
a file that appears, changes or is replaced turns the check back on and is verified again. Every
extension binary a webloop process loads has therefore passed DuckDB's own signature check in
that process. Sandboxed connections (SQL written by people) cannot load extensions at all
(:func:`warehouse.connection.sandbox`).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import duckdb

__all__ = ["connect_config", "verified"]

Identity = tuple[int, int, int, int, int]


def _identity(path: Path) -> Identity:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@lru_cache(maxsize=1)
def _subfolder() -> str:
    """Where DuckDB looks under the extension directory: ``v<version>/<platform>``."""
    con = duckdb.connect()
    try:
        version = con.execute("SELECT library_version FROM pragma_version()").fetchone()[0]
        platform = con.execute("PRAGMA platform").fetchone()[0]
    finally:
        con.close()
    return f"{version}/{platform}"


def _files(folder: str) -> dict[str, Identity]:
    """The extension files DuckDB would load from ``folder``, with their identities."""
    found = sorted((Path(folder) / _subfolder()).glob("*.duckdb_extension"))
    return {str(p): _identity(p) for p in found}


_LOCK = threading.Lock()
_verified: dict[str, dict[str, Identity]] = {}  # folder → the files verified in this process


def verified(folder: str) -> bool:
    """Whether every extension file in ``folder`` has passed DuckDB's signature check in this
    process, unchanged since; checks the ones that have not (once each). False when the folder
    holds none, or a file fails the check (DuckDB's own check then reports it at its LOAD)."""
    with _LOCK:
        current = _files(folder)
        if not current:
            return False
        done = _verified.get(folder, {})
        todo = [p for p, ident in current.items() if done.get(p) != ident]
        if not todo:
            return True
        con = duckdb.connect(
            config={
                "extension_directory": folder,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            }
        )
        try:
            for path in todo:
                con.execute("LOAD '" + path.replace("'", "''") + "'")
        except duckdb.Error:
            _verified.pop(folder, None)
            return False
        finally:
            con.close()
        if _files(folder) != current:  # changed while it was being checked: check again later
            _verified.pop(folder, None)
            return False
        _verified[folder] = current
        return True


def connect_config(folder: str) -> dict[str, Any]:
    """The ``duckdb.connect`` config of a warehouse connection: extensions from ``folder`` (the
    wheels' :func:`warehouse.connection.extension_directory`), never downloaded, autoloaded when
    a statement needs one (ducklake at ATTACH); their signature check skipped when
    :func:`verified` says this process has already done it."""
    config: dict[str, Any] = {
        "extension_directory": folder,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": True,
    }
    if verified(folder):
        config["allow_unsigned_extensions"] = True
    return config
