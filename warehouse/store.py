"""The warehouse: typed, idempotent bulk writes and polars reads over the DuckLake.

Open one with :meth:`Warehouse.open` (from the environment) and use it from one thread; every
process opens its own. Writes take records or frames of one record type, run in a transaction
(retried on contention) and are idempotent by key: rewriting a row leaves one copy, and a row
whose non-volatile columns did not change is not rewritten at all (no new snapshot churn).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import polars as pl

from warehouse import migrations
from warehouse.config import WarehouseConfig, redact
from warehouse.connection import LAKE, WarehouseError, connect, with_retry
from warehouse.objectblobs import open_blobs
from warehouse.records import (
    TERMINAL_STATUSES,
    Record,
    Step,
    Trajectory,
    conform,
    from_frame,
    polars_schema,
    to_frame,
)
from warehouse.relations import with_relations
from warehouse.secrets import redact_frame

R = TypeVar("R", bound=Record)
T = TypeVar("T")
QUERY_DIR = Path(__file__).parent / "queries"
Rows = Sequence[Record] | pl.DataFrame


@dataclass(frozen=True)
class WriteResult:
    """How many rows a write inserted and updated (unchanged rows count in neither)."""

    inserted: int = 0
    updated: int = 0

    def __add__(self, other: WriteResult) -> WriteResult:
        return WriteResult(self.inserted + other.inserted, self.updated + other.updated)


def run_sql_file(wh: Warehouse, folder: Path, name: str, /, **params: Any) -> pl.DataFrame:
    """Run the query file ``<folder>/<name>.sql`` with named parameters: the one runner of
    webloop's analytic queries (``warehouse/queries``, ``dashboards/sql``).

    The file's ``$name`` parameters that the caller leaves out are NULL (by convention, "no
    filter"); a parameter the file does not declare is an error (a typo would silently mean "no
    filter"). The shared relations the file names (``trajectory_tasks``, ``latest_judgments``,
    …: :mod:`warehouse.relations`) are defined for it."""
    path = Path(folder) / f"{name}.sql"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in Path(folder).glob("*.sql")))
        raise WarehouseError(f"no query named {name!r} in {folder} (known: {known})")
    text = path.read_text(encoding="utf-8")
    declared = set(re.findall(r"\$([A-Za-z_]\w*)", text))
    unknown = set(params) - declared
    if unknown:
        raise WarehouseError(f"query {name!r} takes no parameter(s) {sorted(unknown)}")
    return wh.sql(with_relations(text), {k: params.get(k) for k in declared} or None)


class Warehouse:
    """A connection to one webloop warehouse (catalog + data files + blob store)."""

    def __init__(self, cfg: WarehouseConfig, con: duckdb.DuckDBPyConnection) -> None:
        self.cfg = cfg
        self.con = con
        self.blobs = open_blobs(cfg.blob_path, cfg.home)
        # traj_id -> (status, n_steps) of trajectories known to be stored, per run loaded once:
        # lets write_trajectories skip a scan of the steps table on every batch.
        self._known: dict[str, tuple[str, int]] = {}
        self._known_runs: set[str] = set()
        # Held while DuckDB's thread count changes (`_one_thread`, `_all_threads`). `SET threads`
        # reconfigures this DuckDB instance's scheduler and deadlocks against a query running on
        # another cursor of the same database in another thread (seen: the run lease's
        # heartbeat). Code that queries ``con.cursor()`` from another thread holds it too.
        self.settings_lock = threading.RLock()
        # The thread count queries run with, while appends have lowered it to 1 (None: not
        # lowered). Lowered by the first append and left so for the next; restored by the next
        # query or non-append write (see `_one_thread`).
        self._query_threads: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        cfg: WarehouseConfig | None = None,
        *,
        migrate: bool = True,
        read_only: bool = False,
        sandboxed: bool = False,
    ) -> Warehouse:
        """Open (and by default create or upgrade) the warehouse described by ``cfg``/the env."""
        cfg = cfg or WarehouseConfig.from_env()
        con = connect(cfg, read_only=read_only, sandboxed=sandboxed)
        try:
            if migrate and not read_only:
                migrations.migrate(con)
            else:
                migrations.check_not_newer(con)
        except BaseException:
            con.close()
            raise
        return cls(cfg, con)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ----------------------------------------------------------------------------------
    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
        """Run a query (values as ``?`` or ``$name`` parameters) and return a polars frame."""
        self._all_threads()
        try:
            return with_retry(lambda: self.con.execute(query, params).pl(), what="query")
        except duckdb.Error as exc:
            raise type(exc)(redact(str(exc), self.cfg.secret)) from None

    def read(
        self,
        cls: type[Record],
        where: str | None = None,
        params: Sequence[Any] | dict[str, Any] | None = None,
        *,
        version: int | None = None,
    ) -> pl.DataFrame:
        """All rows of a record's table (optionally filtered, optionally at a pinned snapshot)."""
        at = " AT (VERSION => $__version)" if version is not None else ""
        q = f"SELECT * FROM {LAKE}.{cls.TABLE}{at}"
        if where:
            q += f" WHERE {where}"
        if version is not None:
            if isinstance(params, Sequence) and params:
                raise ValueError("use named ($name) parameters together with version=")
            params = {**(params or {}), "__version": int(version)}
        return self.sql(q, params)

    def records(
        self,
        cls: type[R],
        where: str | None = None,
        params: Sequence[Any] | dict[str, Any] | None = None,
    ) -> list[R]:
        """Like :meth:`read`, as record objects."""
        return from_frame(cls, self.read(cls, where, params))

    def query(self, name: str, **params: Any) -> pl.DataFrame:
        """Run the analytic query ``warehouse/queries/<name>.sql`` (see :func:`run_sql_file`)."""
        return run_sql_file(self, QUERY_DIR, name, **params)

    def count(self, cls: type[Record]) -> int:
        return int(self.sql(f"SELECT count(*) AS n FROM {LAKE}.{cls.TABLE}").item())

    # -- writes ---------------------------------------------------------------------------------
    def transaction(self, body: Callable[[], T], *, what: str, message: str | None = None) -> T:
        """Run ``body`` in one transaction, retried as a whole on transient contention."""
        self._all_threads()
        return self._transaction(body, what=what, message=message)

    def _transaction(self, body: Callable[[], T], *, what: str, message: str | None) -> T:
        def attempt() -> T:
            self.con.execute("BEGIN")
            try:
                out = body()
                if message:
                    self.con.execute("CALL lake.set_commit_message('webloop', ?)", [message])
                self.con.execute("COMMIT")
                return out
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    self.con.execute("ROLLBACK")
                raise

        return with_retry(attempt, what=what)

    def write(self, rows: Rows, cls: type[Record] | None = None) -> WriteResult:
        """Write records (or a frame of ``cls`` rows) idempotently, in one transaction."""
        return self.write_many([(rows, cls)])

    def write_many(self, batches: Sequence[tuple[Rows, type[Record] | None]]) -> WriteResult:
        """Write several tables' rows in ONE transaction: readers see all of it or none."""
        prepared = [_prepare(rows, cls) for rows, cls in batches]
        prepared = [(c, f) for c, f in prepared if f.height]
        if not prepared:
            return WriteResult()

        def body() -> WriteResult:
            total = WriteResult()
            for cls, frame in prepared:
                total += self._write_frame(cls, frame)
            return total

        result = self.transaction(body, what="write")
        for cls, frame in prepared:
            if cls is Trajectory:
                self._remember(frame)
        return result

    def replace_where(self, cls: type[Record], column: str, value: Any, rows: Rows) -> WriteResult:
        """Delete ``cls``'s rows whose ``column`` equals ``value`` and write ``rows``, in one
        transaction (a derived table recomputed as a whole, e.g. a run's protocol comparison:
        readers see the old rows or the new ones, never a mix)."""
        if column not in {f.name for f in dataclasses.fields(cls)}:
            raise ValueError(f"{cls.TABLE} has no column {column!r}")
        _, frame = _prepare(rows, cls)

        def body() -> WriteResult:
            self.con.execute(f"DELETE FROM {LAKE}.{cls.TABLE} WHERE {column} = ?", [value])
            return self._write_frame(cls, frame) if frame.height else WriteResult()

        return self.transaction(body, what=f"replace {cls.TABLE}")

    def write_trajectories(
        self, trajectories: Rows, steps: Rows, extra: Sequence[tuple[Rows, type[Record]]] = ()
    ) -> WriteResult:
        """Write trajectories with their steps (and optional other rows) in one transaction.

        This is the collector's hot path. A trajectory is the unit: its steps are (re)written
        only when the trajectory is new, or was stored unfinished or with another step count
        (then its old steps are replaced). A finished trajectory written again leaves one copy
        and, if unchanged, no new snapshot. Which trajectories exist is looked up once per run
        and then tracked in memory, so a batch of new trajectories costs no scan of the stored
        tables (rewrites are checked against the table). One run is meant to have one writer at
        a time (the collector that owns it): another process adding trajectories to the same
        run after this one loaded it is not seen.
        """
        _, trajs = _prepare(trajectories, Trajectory)
        _, step_frame = _prepare(steps, Step)
        orphans = set(step_frame.get_column("traj_id")) - set(trajs.get_column("traj_id"))
        if orphans:
            raise WarehouseError(
                f"steps given for trajectories not in this write: {sorted(orphans)[:5]}"
            )
        self._load_known(set(trajs.get_column("run_id")))
        # Membership per row of this batch, O(batch); an is_in over every known id grew with the
        # run (~20 ms a call at 50k trajectories on busy cores).
        known = self._known
        ids = trajs.get_column("traj_id")
        maybe_stored = pl.Series([t in known for t in ids], dtype=pl.Boolean)
        fresh, again = trajs.filter(~maybe_stored), trajs.filter(maybe_stored)
        extras = [_prepare(rows, cls) for rows, cls in extra]

        def body() -> WriteResult:
            total = self._write_frame(Trajectory, fresh, all_new=True)
            keep: list[str] = []
            if again.height:  # rewrites: check what is really stored, inside the transaction
                stored = self._stored_states(again.get_column("traj_id").to_list())
                for tid, status, n in again.select("traj_id", "status", "n_steps").iter_rows():
                    if stored.get(tid) == (status, n) and status in TERMINAL_STATUSES:
                        keep.append(tid)
                redo = [t for t in again.get_column("traj_id").to_list() if t not in keep]
                total += self._write_frame(Trajectory, again)
                if redo:
                    self._register("__redo", pl.DataFrame({"traj_id": redo}))
                    self.con.execute(
                        f"DELETE FROM {LAKE}.steps WHERE traj_id IN (SELECT traj_id FROM __redo)"
                    )
            new_steps = step_frame.filter(~pl.col("traj_id").is_in(keep)) if keep else step_frame
            if new_steps.height:
                total += self._write_frame(Step, new_steps, all_new=True)
            for cls, frame in extras:
                total += self._write_frame(cls, frame)
            return total

        if again.height:
            result = self.transaction(body, what="write trajectories")
        else:  # appends only (the common case): no scan of stored tables to parallelise
            self._one_thread()
            result = self._transaction(body, what="write trajectories", message=None)
        self._remember(trajs)
        return result

    # -- internals ------------------------------------------------------------------------------
    def _one_thread(self) -> None:
        """Run DuckDB on the calling thread only, for small appends.

        A 1,000-row append is far too small to split; with worker threads each statement hands
        its tasks over and wakes them up, which cost ~25-35% more CPU per transaction (measured
        on 2 busy cores). This DuckDB instance is this Warehouse's own, so the setting touches
        nothing else. It stays lowered for the next append (a collector appends batch after
        batch: switching back and forth cost ~7 ms a transaction, a fifth of it) and is
        restored by the next query or other write (:meth:`_all_threads`).
        """
        with self.settings_lock:
            if self._query_threads is not None:
                return
            threads = int(self.con.execute("SELECT current_setting('threads')").fetchone()[0])
            if threads > 1:
                self.con.execute("SET threads = 1")
            self._query_threads = threads

    def _all_threads(self) -> None:
        """Give queries back the thread count that appends lowered (a no-op when not lowered)."""
        if self._query_threads is None:
            return
        with self.settings_lock:
            if self._query_threads is not None:
                if self._query_threads > 1:
                    self.con.execute("SET threads = ?", [self._query_threads])
                self._query_threads = None

    def _register(self, name: str, frame: pl.DataFrame) -> None:
        self.con.register(name, frame.to_arrow())

    def _write_frame(
        self, cls: type[Record], frame: pl.DataFrame, *, all_new: bool = False
    ) -> WriteResult:
        """Idempotent write of one table's rows; ``all_new`` skips the key lookup (caller knows)."""
        table = f"{LAKE}.{cls.TABLE}"
        if all_new:
            self.con.from_arrow(frame.to_arrow()).insert_into(table)
            return WriteResult(inserted=frame.height)
        self._register("__src", frame)
        cols = [f.name for f in dataclasses.fields(cls)]
        on = " AND ".join(f"t.{k} IS NOT DISTINCT FROM s.{k}" for k in cls.KEY)
        existing = self.con.execute(
            f"SELECT count(*) FROM __src s WHERE EXISTS (SELECT 1 FROM {table} t WHERE {on})"
        ).fetchone()[0]
        inserted = frame.height - int(existing)
        if cls.MODE == "insert":
            if inserted:
                self.con.execute(
                    f"INSERT INTO {table} SELECT s.* FROM __src s WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {table} t WHERE {on})"
                )
            return WriteResult(inserted=inserted)
        compare = [c for c in cols if c not in cls.KEY and c not in cls.VOLATILE]
        changed = " OR ".join(f"t.{c} IS DISTINCT FROM s.{c}" for c in compare) or "false"
        sets = ", ".join(f"{c} = s.{c}" for c in cols if c not in cls.KEY)
        col_list = ", ".join(cols)
        vals = ", ".join(f"s.{c}" for c in cols)
        affected = self.con.execute(
            f"MERGE INTO {table} AS t USING __src AS s ON {on} "
            f"WHEN MATCHED AND ({changed}) THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED THEN INSERT ({col_list}) VALUES ({vals})"
        ).fetchone()[0]
        return WriteResult(inserted=inserted, updated=int(affected) - inserted)

    def _load_known(self, run_ids: set[str]) -> None:
        todo = sorted(run_ids - self._known_runs)
        if not todo:
            return
        rows = self.con.execute(
            f"SELECT traj_id, status, n_steps FROM {LAKE}.trajectories "
            "WHERE run_id IN (SELECT unnest(?))",
            [todo],
        ).fetchall()
        for tid, status, n in rows:
            self._known[tid] = (status, n)
        self._known_runs.update(todo)

    def _stored_states(self, traj_ids: list[str]) -> dict[str, tuple[str, int]]:
        rows = self.con.execute(
            f"SELECT traj_id, status, n_steps FROM {LAKE}.trajectories "
            "WHERE traj_id IN (SELECT unnest(?))",
            [traj_ids],
        ).fetchall()
        return {tid: (status, n) for tid, status, n in rows}

    def _remember(self, trajs: pl.DataFrame) -> None:
        for tid, status, n in trajs.select("traj_id", "status", "n_steps").iter_rows():
            self._known[tid] = (status, n)


def _prepare(rows: Rows, cls: type[Record] | None) -> tuple[type[Record], pl.DataFrame]:
    if isinstance(rows, pl.DataFrame):
        if cls is None:
            raise ValueError("writing a frame needs its record type (cls=)")
        # A frame already in the record's exact schema (column order and types) is what conform
        # would return: skip the select/cast.
        exact = list(rows.schema.items()) == list(polars_schema(cls).items())
        frame = rows if exact else conform(cls, rows)
    else:
        if not rows:
            if cls is None:
                raise ValueError("writing an empty list needs its record type (cls=)")
            return cls, to_frame([], cls)
        kinds = {type(r) for r in rows}
        if len(kinds) != 1 or (cls is not None and kinds != {cls}):
            raise ValueError(f"one record type per write, got {sorted(k.__name__ for k in kinds)}")
        cls = kinds.pop()
        frame = to_frame(rows, cls)
    frame = redact_frame(frame)  # no API key, password or URL credential is ever stored
    # A key written twice in one batch: the last one wins (MERGE needs unique source keys).
    return cls, frame.unique(subset=list(cls.KEY), keep="last", maintain_order=True)
