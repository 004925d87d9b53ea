"""Moving a warehouse to a team set-up: ``webloop warehouse copy --to CATALOG [--data-path URL]
[--blobs URL]``.

A DuckLake warehouse is a catalog (SQL tables: every snapshot, every data file, the schema), the
Parquet data files it names (paths relative to its data path) and, for webloop, the blob store.
The copy moves all three and keeps every snapshot with its id, so everything that names a
snapshot (datasets, pins, ``--snapshot N``, time travel) reads the same rows in the copy:

1. the data files the catalog names, to the new data path (same relative paths), each skipped
   when the destination already holds it at its size;
2. the blobs, skipped when already there (content-addressed: a blob's name is its hash, and
   every blob copied is read back through the source's hash check);
3. the catalog last, in one transaction: the destination's DuckLake metadata tables replaced by
   the source's, the data path set to the new one. Until then the destination names no file
   that is not yet copied, and an interrupted copy leaves it as it was.

Every path the catalog names (schema, table and file paths) must stay below the data path: a
``..`` component, an absolute path or a backslash, or a path that resolves outside its folder
(a link) is refused with the catalog row that names it, before anything is read or written (the
catalog is copied whole, so a bad row cannot be left out of it: the copy does not start).

Re-running resumes (copied files and blobs are skipped) and a copy that has nothing left to do
says so. The source is only read. A destination that has snapshots of its own (someone wrote
to it) is refused: a copy never overwrites history that is not the source's. The result is
verified by opening the destination as a warehouse: rows per table at the latest snapshot and at
every pinned one, and every blob present.
"""

from __future__ import annotations

import contextlib
import posixpath
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from warehouse.blobs import BlobCorruptError, Blobs
from warehouse.config import ConfigError, WarehouseConfig
from warehouse.connection import (
    LAKE,
    WarehouseError,
    attach_target,
    connect,
    sql_string,
)
from warehouse.objectblobs import open_blobs
from warehouse.objectstore import S3Settings, is_object_url, split_url
from warehouse.records import RECORD_TYPES
from warehouse.secrets import redact
from warehouse.store import Warehouse
from warehouse.versions import current_snapshot, pinned_snapshots

Progress = Callable[[str], None]


class CopyError(WarehouseError):
    """A copy that cannot go on (the destination diverged, a count differs); nothing of the
    source changed."""


@dataclass
class CopyReport:
    """What a copy did and what it verified."""

    files_copied: int = 0
    files_present: int = 0
    blobs_copied: int = 0
    blobs_present: int = 0
    catalog: str = ""  # "copied", "unchanged"
    snapshots: int = 0
    pinned: list[int] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def nothing_to_do(self) -> bool:
        return self.files_copied == 0 and self.blobs_copied == 0 and self.catalog == "unchanged"


def copy_warehouse(
    src: WarehouseConfig, dst: WarehouseConfig, progress: Progress | None = None
) -> CopyReport:
    """Copy the warehouse ``src`` describes to ``dst`` (see the module docstring)."""
    say = progress or (lambda _m: None)
    if (dst.catalog_kind, dst.catalog) == (src.catalog_kind, src.catalog):
        raise ConfigError(f"--to names the source catalog itself ({src.describe()})")
    if dst.data_path.rstrip("/") == src.data_path.rstrip("/"):
        raise ConfigError(
            f"--data-path {dst.data_path} is the source's own: two catalogs must not share a data "
            "path (maintenance of either would delete files the other reads); name another"
        )
    report = CopyReport()
    with Warehouse.open(src, read_only=True) as wh:
        files = data_files(wh, roots=(src.data_path, dst.data_path))
        report.snapshots = current_snapshot(wh)
        report.pinned = sorted(pinned_snapshots(wh))
        src_counts = counts(wh, [None, *report.pinned])
        say(f"source {src.describe()}: {len(files)} data files, snapshots up to {report.snapshots}")
        check_destination(wh, dst)
        report.files_copied, report.files_present = copy_files(
            src.data_path, dst.data_path, files, say
        )
        report.blobs_copied, report.blobs_present = copy_blobs(wh.blobs, dst, say)
        report.catalog = copy_catalog(wh, dst, report.snapshots, say)
    report.rows = verify(dst, src_counts, report, say)
    return report


# -- data files ---------------------------------------------------------------------------------


def data_files(wh: Warehouse, roots: tuple[str, ...] = ()) -> dict[str, int]:
    """Every Parquet file the catalog names (data and delete files, any snapshot), relative
    to the data path, with its size. A path that would leave the data path (see
    :func:`path_problem`), or that resolves outside any of the data paths ``roots``, raises
    :class:`CopyError` naming it and its catalog row (every such row, before any copy)."""
    meta = f"__ducklake_metadata_{LAKE}"
    rows = wh.con.execute(
        f"""
        WITH files AS (
            SELECT 'ducklake_data_file' AS tbl, 'data_file_id' AS id_name, data_file_id AS id,
                   table_id, path, path_is_relative, file_size_bytes
            FROM {meta}.ducklake_data_file
            UNION ALL
            SELECT 'ducklake_delete_file', 'delete_file_id', delete_file_id,
                   table_id, path, path_is_relative, file_size_bytes
            FROM {meta}.ducklake_delete_file
        ),
        tables AS (
            SELECT DISTINCT t.table_id, s.path AS schema_path, s.path_is_relative AS s_rel,
                   t.path AS table_path, t.path_is_relative AS t_rel
            FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id)
        )
        SELECT f.tbl, f.id_name, f.id, f.table_id, f.path, f.path_is_relative, t.schema_path,
               t.s_rel, t.table_path, t.t_rel, f.file_size_bytes
        FROM files f LEFT JOIN tables t USING (table_id)
        ORDER BY f.tbl, f.id
        """
    ).fetchall()
    out: dict[str, int] = {}
    bad: list[str] = []
    for r in rows:
        tbl, id_name, row_id, table_id = r[:4]
        path, rel, schema_path, s_rel, table_path, t_rel, size = r[4:]
        parts = [p for p in (schema_path, table_path, path) if p]
        joined = "".join(parts)
        if not (rel and (t_rel in (None, True)) and (s_rel in (None, True))):
            problem: str | None = "an absolute path (not under the data path)"
        else:
            problem = next(filter(None, map(path_problem, [*parts, joined])), None)
            problem = problem or next(filter(None, (_outside(d, joined) for d in roots)), None)
        if problem:
            bad.append(
                f"{tbl} row {id_name}={row_id} (table_id {table_id}) names {joined!r}: {problem}"
            )
        else:
            out[joined] = int(size)
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise CopyError(
            f"{len(bad)} catalog {'path' if len(bad) == 1 else 'paths'} would leave the data "
            "path; nothing was copied: "
            + "; ".join(bad[:5])
            + more
            + ". A catalog path must be relative, without '..' or '\\', below the data path"
        )
    return out


def path_problem(rel: str) -> str | None:
    """Why ``rel``, a path the catalog names below a data path, may not be used (None: it
    may): absolute, a backslash (another system's separator), a ``..`` component, a NUL."""
    if rel.startswith("/"):
        return "an absolute path"
    if "\\" in rel:
        return "a backslash in it"
    if ".." in rel.split("/"):
        return "a '..' component"
    if "\x00" in rel:
        return "a NUL character in it"
    return None


def _outside(root: str, rel: str) -> str | None:
    """Why ``root`` + ``rel`` is not below ``root`` once resolved (links followed, for a
    folder; the normalised key, for object storage), or None."""
    base = root.rstrip("/") + "/"
    if is_object_url(root):  # keys: no links, only the text
        key = posixpath.normpath(rel)
        inside = key != ".." and not key.startswith(("../", "/"))
        return None if inside else f"outside {base}"
    folder = Path(base).resolve()
    target = Path(base + rel).resolve()
    return None if target.is_relative_to(folder) else f"resolves to {target}, outside {folder}"


class _Files:
    """A folder or an ``s3://`` prefix, for whole-file copies that stream (a Parquet file is
    never held in memory) and never show half a file under its name."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") + "/"
        self.remote = is_object_url(root)
        if self.remote:
            bucket, prefix = split_url(root)
            self.base = f"{bucket}/{prefix}".rstrip("/") + "/"
            self.fs: Any = S3Settings.from_env().filesystem()

    def check(self, rel: str) -> None:
        """Raise :class:`CopyError` unless ``rel`` stays below this root."""
        problem = path_problem(rel) or _outside(self.root, rel)
        if problem:
            raise CopyError(f"data file {rel!r} under {self.root}: {problem}")

    def size(self, rel: str) -> int | None:
        if self.remote:
            try:
                return int(self.fs.info(self.base + rel)["size"])
            except FileNotFoundError:
                return None
        p = Path(self.root + rel)
        return p.stat().st_size if p.is_file() else None

    def local_tmp(self, rel: str) -> tuple[Path, Path]:
        """(the file's path, a temporary name beside it) in this folder."""
        target = Path(self.root + rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".tmp-{target.name}")
        tmp.unlink(missing_ok=True)  # (a link left there is not written through)
        return target, tmp


def _copy_one(a: _Files, b: _Files, rel: str, size: int) -> None:
    """One file from ``a`` to ``b``: an object upload is visible only once complete; a local
    file is written under a temporary name, then renamed."""
    if a.remote and b.remote:
        a.fs.copy(a.base + rel, b.base + rel)  # server-side (one set of credentials)
    elif b.remote:
        b.fs.put_file(a.root + rel, b.base + rel)
    else:
        target, tmp = b.local_tmp(rel)
        if a.remote:
            a.fs.get_file(a.base + rel, str(tmp))
        else:
            shutil.copyfile(a.root + rel, tmp)
        tmp.replace(target)
    got = b.size(rel)
    if got != size:
        raise CopyError(
            f"data file {b.root}{rel}: {got} bytes after the copy, the catalog says {size}"
        )


def copy_files(src: str, dst: str, files: dict[str, int], say: Progress) -> tuple[int, int]:
    """Copy ``files`` (relative path → size) from data path ``src`` to ``dst``: (copied,
    already present at their size)."""
    a, b = _Files(src), _Files(dst)
    copied = present = 0
    for i, (rel, size) in enumerate(sorted(files.items()), start=1):
        a.check(rel)  # (data_files checked every path before any copy)
        b.check(rel)
        try:
            if b.size(rel) == size:
                present += 1
                continue
            _copy_one(a, b, rel, size)
        except CopyError:
            raise
        except Exception as exc:  # storage errors (an outage, a refused write)
            raise CopyError(
                f"copying data file {rel} from {src} to {dst} failed "
                f"({copied} copied so far; re-run to resume): {redact(str(exc))}"
            ) from None
        copied += 1
        if copied % 200 == 0 or i == len(files):
            say(f"data files: {copied} copied, {present} already there ({i}/{len(files)})")
    return copied, present


# -- blobs --------------------------------------------------------------------------------------


def copy_blobs(src: Blobs, dst_cfg: WarehouseConfig, say: Progress) -> tuple[int, int]:
    """Copy every blob of ``src`` to the destination's store: (copied, already there)."""
    dst = open_blobs(dst_cfg.blob_path, dst_cfg.home)
    if dst.location.rstrip("/") == src.location.rstrip("/"):
        return 0, sum(1 for _ in src)
    copied = present = 0
    for digest in src:
        try:
            if dst.exists(digest):
                present += 1
                continue
            dst.put(src.get(digest))  # get verifies the hash; put names it by its bytes
        except BlobCorruptError:
            raise
        except Exception as exc:  # the storage did not answer
            raise CopyError(
                f"copying blob {digest} from {src.location} to {dst.location} failed "
                f"({copied} copied so far; re-run to resume): {redact(str(exc))}"
            ) from None
        copied += 1
        if copied % 500 == 0:
            say(f"blobs: {copied} copied, {present} already there")
    say(f"blobs: {copied} copied, {present} already there")
    return copied, present


# -- the catalog --------------------------------------------------------------------------------

_HISTORY = "snapshot_id, schema_version, next_catalog_id, next_file_id"
"""What identifies a snapshot across catalog databases (integers: no time zones to disagree)."""


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _raw_attach(con: duckdb.DuckDBPyConnection, cfg: WarehouseConfig, alias: str) -> str:
    """ATTACH ``cfg``'s catalog database itself (not through DuckLake) as ``alias``; the
    schema that holds its DuckLake tables. A PostgreSQL password goes in a secret of its own,
    named in the ATTACH (never the source's, never in the ATTACH string)."""
    target = attach_target(cfg).removeprefix("ducklake:")
    kind, _, where = target.partition(":")
    opts = f"TYPE {kind}"
    if kind == "postgres":
        password = f", PASSWORD {sql_string(cfg.secret)}" if cfg.secret else ""
        con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {alias}_pw (TYPE postgres{password})")
        opts += f", SECRET {alias}_pw"
    con.execute(f"ATTACH {sql_string(where)} AS {alias} ({opts})")
    found = con.execute(
        "SELECT schema_name FROM duckdb_tables() WHERE database_name = ? "
        "AND table_name = 'ducklake_snapshot'",
        [alias],
    ).fetchall()
    if len(found) != 1:
        con.execute(f"DETACH {alias}")
        raise CopyError(f"{cfg.describe()}: no DuckLake catalog (or more than one) in it")
    return f"{alias}.{_q(found[0][0])}"


def _detach(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    con.execute(f"DETACH {alias}")
    con.execute(f"DROP TEMPORARY SECRET IF EXISTS {alias}_pw")


def _tables(con: duckdb.DuckDBPyConnection, schema: str) -> list[str]:
    """The DuckLake tables of ``schema`` (``db.schema``, or a database's default schema)."""
    db, _, name = schema.partition(".")
    query = "SELECT table_name FROM duckdb_tables() WHERE database_name = ? "
    params = [db]
    if name:
        query += "AND schema_name = ? "
        params.append(name.strip('"').replace('""', '"'))
    rows = con.execute(query + "AND table_name LIKE 'ducklake%' ORDER BY 1", params).fetchall()
    return [r[0] for r in rows]


def _history(con: duckdb.DuckDBPyConnection, schema: str) -> list[tuple[Any, ...]]:
    return con.execute(f"SELECT {_HISTORY} FROM {schema}.ducklake_snapshot ORDER BY 1").fetchall()


def _check_history(mine: list[tuple[Any, ...]], theirs: list[tuple[Any, ...]], dst: str) -> None:
    """Refuse a destination whose history is not a prefix of the source's (a catalog DuckLake
    just created, its snapshot 0 only, holds nothing to keep)."""
    fresh = len(theirs) == 1 and theirs[0][0] == 0
    if theirs and theirs != mine[: len(theirs)] and not fresh:
        raise CopyError(
            f"{dst} already holds a warehouse with history of its own ({len(theirs)} "
            "snapshots, not the source's): copy to an empty catalog"
        )


def check_destination(wh: Warehouse, dst: WarehouseConfig) -> None:
    """Create the destination catalog if need be (a bad URL or password fails here, before
    anything is copied) and refuse one with history of its own."""
    connect(dst).close()
    schema = _raw_attach(wh.con, dst, "wl_dst")
    try:
        _check_history(_history(wh.con, _SRC), _history(wh.con, schema), dst.describe())
    finally:
        _detach(wh.con, "wl_dst")


_SRC = f"__ducklake_metadata_{LAKE}"


def copy_catalog(wh: Warehouse, dst: WarehouseConfig, latest: int, say: Progress) -> str:
    """Replace the destination catalog's DuckLake tables by the source's (one transaction),
    with the data path set to ``dst.data_path``: ``"copied"``, or ``"unchanged"`` when it
    already held exactly the source's snapshots and data path. ``latest``: the source's latest
    snapshot when the copy began (a source written since is refused: re-run)."""
    con = wh.con
    schema = _raw_attach(con, dst, "wl_dst")
    try:
        mine = _history(con, _SRC)
        if mine[-1][0] != latest:
            raise CopyError(
                f"the source changed during the copy (snapshot {latest} → {mine[-1][0]}): "
                "stop its writers and re-run (what was copied is kept)"
            )
        path = con.execute(
            f"SELECT value FROM {schema}.ducklake_metadata WHERE key = 'data_path'"
        ).fetchone()
        if _history(con, schema) == mine and path and path[0] == dst.data_path:
            say("catalog: the destination already holds every snapshot")
            return "unchanged"
        tables = _tables(con, _SRC)
        there = set(_tables(con, schema))
        con.execute("BEGIN")
        try:
            _check_history(mine, _history(con, schema), dst.describe())  # again, in the txn
            for t in tables:
                if t in there:
                    con.execute(f"DELETE FROM {schema}.{_q(t)}")
                    con.execute(
                        f"INSERT INTO {schema}.{_q(t)} BY NAME SELECT * FROM {_SRC}.{_q(t)}"
                    )
                else:  # inlined data tables: named per table and schema version
                    con.execute(f"CREATE TABLE {schema}.{_q(t)} AS SELECT * FROM {_SRC}.{_q(t)}")
            con.execute(
                f"UPDATE {schema}.ducklake_metadata SET value = ? WHERE key = 'data_path'",
                [dst.data_path],
            )
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):  # a failed COMMIT has ended it already
                con.execute("ROLLBACK")
            raise
        say(f"catalog: {len(tables)} DuckLake tables copied to {dst.describe()}")
        return "copied"
    finally:
        _detach(con, "wl_dst")


# -- verification -------------------------------------------------------------------------------


def counts(wh: Warehouse, versions: list[int | None]) -> dict[str, int]:
    """Rows per table at each snapshot (``None``: the latest), keyed ``table@version``."""
    out = {}
    for v in versions:
        at = "" if v is None else f" AT (VERSION => {int(v)})"
        for r in RECORD_TYPES:
            try:
                n = wh.con.execute(f"SELECT count(*) FROM {LAKE}.{r.TABLE}{at}").fetchone()[0]
            except duckdb.CatalogException:  # a table created after that snapshot
                n = -1
            out[f"{r.TABLE}@{'latest' if v is None else v}"] = int(n)
    return out


def verify(
    dst: WarehouseConfig, expected: dict[str, int], report: CopyReport, say: Progress
) -> dict[str, int]:
    """Open the copy and compare rows per table at every snapshot counted; raise
    :class:`CopyError` on a difference."""
    with Warehouse.open(dst, read_only=True) as wh:
        got = counts(wh, [None, *report.pinned])
        missing = [h for h in _blob_hashes(wh) if not wh.blobs.exists(h)]
    bad = {k: (v, got.get(k)) for k, v in expected.items() if got.get(k) != v}
    if bad:
        raise CopyError(f"the copy's rows differ from the source's (source, copy): {bad}")
    if missing:
        raise CopyError(f"{len(missing)} blobs the warehouse names are missing, e.g. {missing[0]}")
    say(f"verified: rows of {len(RECORD_TYPES)} tables at {len(report.pinned) + 1} snapshots")
    return {k.removesuffix("@latest"): v for k, v in got.items() if k.endswith("@latest")}


def _blob_hashes(wh: Warehouse) -> list[str]:
    return [r[0] for r in wh.con.execute(f"SELECT hash FROM {LAKE}.blobs").fetchall()]
