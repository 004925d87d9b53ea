"""Where the warehouse lives: catalog, data files and blobs, from the environment or arguments.

Environment variables (all optional):

- ``WEBLOOP_HOME``: the project's data directory (default ``./.webloop``).
- ``WEBLOOP_WAREHOUSE``: the DuckLake catalog. Unset: a SQLite catalog at
  ``$WEBLOOP_HOME/lake/catalog.sqlite``. A ``postgresql://user:pass@host:port/db`` URL selects a
  PostgreSQL catalog (teams, many machines); ``sqlite:PATH`` or a plain path selects a SQLite file.
- ``WEBLOOP_DATA_PATH``: where DuckLake writes Parquet data files (default
  ``$WEBLOOP_HOME/lake/data/``), a folder or an ``s3://bucket/prefix/`` URL (S3-compatible
  storage: credentials, endpoint and region as :mod:`warehouse.objectstore` reads them).
- ``WEBLOOP_BLOBS``: the content-addressed blob store (default ``$WEBLOOP_HOME/blobs``), a
  folder or an ``s3://bucket/prefix`` URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from warehouse.objectstore import is_object_url
from warehouse.secrets import register


class ConfigError(ValueError):
    """A bad option or configuration: the one error type for input a person can fix (a
    warehouse URL, a stage config field, a config file; the message names it). The CLI prints
    it on one line and exits 2."""


@dataclass(frozen=True)
class WarehouseConfig:
    """Resolved locations of one warehouse.

    Attributes:
        home: the project's data directory.
        catalog_kind: ``"sqlite"`` or ``"postgres"``.
        catalog: SQLite file path, or a libpq keyword connection string for PostgreSQL.
        data_path: folder or object-store URL for DuckLake's Parquet files (ends with ``/``).
        blob_path: folder (absolute) or ``s3://`` URL of the content-addressed blob store.
        inline_row_limit: DuckLake data inlining: inserts of at most this many rows are kept in
            the catalog until flushed by maintenance (0 disables inlining).
    """

    home: Path
    catalog_kind: str
    catalog: str
    data_path: str
    blob_path: str
    inline_row_limit: int = 0
    secret: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_env(
        cls,
        home: str | Path | None = None,
        warehouse: str | None = None,
        data_path: str | None = None,
        blob_path: str | Path | None = None,
    ) -> WarehouseConfig:
        """Build a config; explicit arguments win over the environment."""
        home_p = Path(home or os.environ.get("WEBLOOP_HOME") or ".webloop").absolute()
        url = warehouse if warehouse is not None else os.environ.get("WEBLOOP_WAREHOUSE", "")
        kind, catalog, secret = _parse_catalog(url, home_p)
        data = data_path or os.environ.get("WEBLOOP_DATA_PATH") or str(home_p / "lake" / "data")
        if "://" not in data:
            data = str(Path(data).absolute())
        elif not is_object_url(data):
            raise ConfigError(f"WEBLOOP_DATA_PATH={data!r}: use a folder or an s3:// URL")
        if not data.endswith("/"):
            data += "/"
        blobs = str(blob_path or os.environ.get("WEBLOOP_BLOBS") or home_p / "blobs")
        if not is_object_url(blobs):
            if "://" in blobs:
                raise ConfigError(f"WEBLOOP_BLOBS={blobs!r}: use a folder or an s3:// URL")
            blobs = str(Path(blobs).absolute())
        return cls(home_p, kind, catalog, data, blobs, secret=secret)

    def __repr__(self) -> str:  # never show a catalog password
        return f"WarehouseConfig({self.describe()}, data_path={self.data_path!r})"

    def describe(self) -> str:
        """A human-readable catalog description with any password removed."""
        if self.catalog_kind == "sqlite":
            return f"sqlite:{self.catalog}"
        return "postgres:" + redact(self.catalog, self.secret)  # the DSN holds no password

    @property
    def is_local_data(self) -> bool:
        return "://" not in self.data_path

    @property
    def is_local_blobs(self) -> bool:
        return not is_object_url(self.blob_path)


def redact(text: str, secret: str | None) -> str:
    """Replace a secret (a catalog password) wherever it appears in ``text``."""
    return text.replace(secret, "***") if secret else text


def _parse_catalog(url: str, home: Path) -> tuple[str, str, str | None]:
    if not url:
        return "sqlite", str(home / "lake" / "catalog.sqlite"), None
    if url.startswith(("postgresql://", "postgres://")):
        dsn, secret = postgres_dsn(url)
        register(secret)  # masked in everything stored or logged (warehouse.secrets)
        return "postgres", dsn, secret
    if url.startswith("sqlite:"):
        url = url.removeprefix("sqlite:")
    if "://" in url:
        raise ConfigError(
            f"WEBLOOP_WAREHOUSE={url!r}: unsupported catalog URL; use a postgresql:// URL, "
            "sqlite:PATH, or a file path"
        )
    return "sqlite", str(Path(url).absolute()), None


def postgres_dsn(url: str) -> tuple[str, str | None]:
    """Turn a ``postgresql://`` URL into a libpq keyword string without the password, and the
    password. The password never enters the connection string (which DuckDB shows in
    ``duckdb_databases()``): :func:`warehouse.connection.connect` hands it to DuckDB as a
    secret."""
    parts = urlsplit(url)
    if not parts.path.strip("/"):
        raise ConfigError(f"{redact(url, parts.password)}: the URL names no database")
    kv: dict[str, str] = {"dbname": unquote(parts.path.strip("/"))}
    if parts.hostname:
        kv["host"] = parts.hostname
    if parts.port:
        kv["port"] = str(parts.port)
    if parts.username:
        kv["user"] = unquote(parts.username)
    password = unquote(parts.password) if parts.password else None
    query = dict(parse_qsl(parts.query))
    password = query.pop("password", None) or password
    kv.update(query)
    dsn = " ".join(f"{k}={_libpq_quote(v)}" for k, v in kv.items())
    return dsn, password


def _libpq_quote(value: str) -> str:
    if value and all(c.isalnum() or c in "._-/:" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
