"""Run leases: one writer (collector) per run, across processes and machines.

DuckLake has no row locks and no unique constraints, so a lease is taken by *insert, then read
back*: a process inserts a claim row (committed in its own transaction) and then reads every
claim of the run. The holder is the **oldest live claim in commit order** — the DuckLake
snapshot that inserted the claim row (the ``snapshot_id`` virtual column). Commit order is
total: of two racing claimants, the later commit sees the earlier claim when it reads back,
and the earlier one sees itself as the oldest, so exactly one of them holds the lease. Claim
rows are never updated (an update would move a row to a newer snapshot); heartbeats and
releases are written to ``run_lease_beats``.

A claim is live while it is not released, its last heartbeat is younger than its TTL and — when
it was taken on this host — its process still runs (a SIGKILLed collector's lease expires at
once on its own host, after the TTL elsewhere). Clocks of the machines sharing a catalog must
agree to well within the TTL (NTP).

Usage::

    with hold(wh, run_id, holder="collect", wait_s=0) as lease:
        ...            # write the run; lease.check() raises LeaseLostError if it was lost
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import duckdb

from warehouse.connection import LAKE, WarehouseError, with_retry
from warehouse.store import Warehouse

CLAIMS, BEATS = "run_leases", "run_lease_beats"
DEFAULT_TTL_S = 120.0  # same-host holders expire at once when their process dies


class LeaseHeldError(WarehouseError):
    """Another live process holds the run's lease; ``holder`` says who."""

    def __init__(self, message: str, holder: Claim) -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLostError(WarehouseError):
    """This process's lease expired (no heartbeat within its TTL) or was released meanwhile."""


@dataclass(frozen=True)
class Claim:
    """One claim on a run's lease, with its latest heartbeat."""

    run_id: str
    claim_id: str
    holder: str | None
    host: str
    pid: int
    ttl_s: float
    claimed_at: dt.datetime
    beat_at: dt.datetime
    released_at: dt.datetime | None
    snapshot: int  # the DuckLake snapshot that committed the claim: its place in the queue

    def describe(self) -> str:
        since = self.claimed_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        what = f"{self.holder} " if self.holder else ""
        return f"{what}on host {self.host}, pid {self.pid}, since {since}"

    def live(self, now: dt.datetime | None = None) -> bool:
        """Not released, heartbeat younger than the TTL, and (on this host) its process runs."""
        if self.released_at is not None:
            return False
        now = now or _now()
        if (now - self.beat_at).total_seconds() > self.ttl_s:
            return False
        return self.host != this_host() or pid_alive(self.pid)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def this_host() -> str:
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie — killed, not yet reaped — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): the signal answered


def claims(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Claim]:
    """Every claim of ``run_id`` (live or not), oldest (in commit order) first."""
    rows = with_retry(
        lambda: con.execute(
            f"SELECT c.run_id, c.claim_id, c.holder, c.host, c.pid, c.ttl_s, c.claimed_at, "
            f"coalesce(b.beat_at, c.claimed_at), b.released_at, c.snapshot_id "
            f"FROM {LAKE}.{CLAIMS} c LEFT JOIN (SELECT claim_id, max(beat_at) AS beat_at, "
            f"max(released_at) AS released_at FROM {LAKE}.{BEATS} GROUP BY 1) b USING (claim_id) "
            "WHERE c.run_id = ? ORDER BY c.snapshot_id, c.claimed_at, c.claim_id",
            [run_id],
        ).fetchall(),
        what="read leases",
    )
    return [Claim(*r[:5], float(r[5]), *r[6:9], int(r[9])) for r in rows]


def holder_of(con: duckdb.DuckDBPyConnection, run_id: str) -> Claim | None:
    """The live claim that holds ``run_id``'s lease, or None."""
    now = _now()
    return next((c for c in claims(con, run_id) if c.live(now)), None)


def _tx(con: duckdb.DuckDBPyConnection, what: str, *statements: tuple[str, list]) -> None:
    def attempt() -> None:
        con.execute("BEGIN")
        try:
            for sql, params in statements:
                con.execute(sql, params)
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise

    with_retry(attempt, what=what)


def _beat_statements(claim_id: str, released: bool) -> list[tuple[str, list]]:
    now = _now()
    return [
        (f"DELETE FROM {LAKE}.{BEATS} WHERE claim_id = ?", [claim_id]),
        (
            f"INSERT INTO {LAKE}.{BEATS} VALUES (?, ?, ?)",
            [claim_id, now, now if released else None],
        ),
    ]


class Lease:
    """A held lease. Keep it alive with :meth:`beat` (or :func:`hold`'s heartbeat thread)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, claim: Claim) -> None:
        self.con = con
        self.claim = claim
        self.run_id = claim.run_id
        self.lost: str | None = None  # why, once lost
        self._last_beat = time.monotonic()
        self._lock = threading.Lock()

    def beat(self) -> None:
        """Renew the heartbeat; marks the lease lost if it had already expired or was taken."""
        with self._lock:
            if self.lost:
                return
            gap = time.monotonic() - self._last_beat
            if gap > 0.9 * self.claim.ttl_s:  # others may already see it expired
                self.lost = f"no heartbeat for {gap:.0f} s (TTL {self.claim.ttl_s:.0f} s)"
                return
            started = time.monotonic()  # the beat written is stamped before the commit
            _tx(self.con, "lease heartbeat", *_beat_statements(self.claim.claim_id, False))
            self._last_beat = started
            holder = holder_of(self.con, self.run_id)
            if holder is None or holder.claim_id != self.claim.claim_id:
                who = holder.describe() if holder else "nobody"
                self.lost = f"the lease is now held by {who}"

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost (then stop writing the run)."""
        if self.lost:
            raise LeaseLostError(f"lost the lease on run {self.run_id!r}: {self.lost}")

    def release(self) -> None:
        with self._lock:
            _tx(self.con, "lease release", *_beat_statements(self.claim.claim_id, True))
            self.lost = self.lost or "released"


def acquire(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    *,
    holder: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait_s: float = 0.0,
    poll_s: float = 1.0,
    on_wait: Callable[[Claim], None] | None = None,
) -> Lease:
    """Take ``run_id``'s lease: insert a claim, read the claims back, hold if ours is the oldest
    live one. Otherwise wait (queued, heartbeating) up to ``wait_s`` seconds, calling
    ``on_wait(holder)`` once per holder seen, then withdraw the claim and raise
    :class:`LeaseHeldError` naming the holder (host, pid, since)."""
    if ttl_s <= 0 or wait_s < 0 or poll_s <= 0:
        raise WarehouseError("lease: ttl_s and poll_s must be positive, wait_s not negative")
    mine = uuid.uuid4().hex
    now = _now()
    _tx(
        con,
        "lease claim",
        (
            f"INSERT INTO {LAKE}.{CLAIMS} VALUES (?, ?, ?, ?, ?, ?, ?)",
            [run_id, mine, holder, this_host(), os.getpid(), float(ttl_s), now],
        ),
        *_beat_statements(mine, False),
    )
    deadline = time.monotonic() + wait_s
    seen: set[str] = set()
    last_beat = time.monotonic()
    try:
        while True:
            current = holder_of(con, run_id)
            if current is not None and current.claim_id == mine:
                lease = Lease(con, current)
                lease._last_beat = last_beat
                return lease
            if current is None:  # our own claim expired while waiting (a stalled process)
                raise WarehouseError(
                    f"the lease claim on run {run_id!r} expired before it was read back: its "
                    f"TTL ({ttl_s:g} s) is shorter than this catalog's commit and read times"
                )
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"run {run_id!r} is being written by another process ({current.describe()}); "
                    + (f"waited {wait_s:.0f} s. " if wait_s else "")
                    + "Wait for it to finish, or stop it: its lease expires "
                    f"{current.ttl_s:.0f} s after its last heartbeat, at once on its own host "
                    "if its process is gone",
                    current,
                )
            if current.claim_id not in seen:
                seen.add(current.claim_id)
                if on_wait:
                    on_wait(current)
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            if time.monotonic() - last_beat > ttl_s / 3:
                started = time.monotonic()
                _tx(con, "lease heartbeat", *_beat_statements(mine, False))
                last_beat = started
    except BaseException:
        with contextlib.suppress(Exception):
            _tx(con, "lease withdraw", *_beat_statements(mine, True))
        raise


@contextlib.contextmanager
def hold(
    wh: Warehouse,
    run_id: str,
    *,
    holder: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait_s: float = 0.0,
    poll_s: float = 1.0,
    on_wait: Callable[[Claim], None] | None = None,
) -> Iterator[Lease]:
    """Hold ``run_id``'s lease for the ``with`` body, heartbeating every ``ttl_s / 3`` seconds
    from a thread (on its own connection to ``wh``'s database); released at the end. See
    :func:`acquire` for waiting and refusal."""
    con = wh.con.cursor()
    try:
        lease = acquire(
            con, run_id, holder=holder, ttl_s=ttl_s, wait_s=wait_s, poll_s=poll_s, on_wait=on_wait
        )
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(ttl_s / 3):
                try:
                    with wh.settings_lock:  # never beside a `SET threads` (store._one_thread)
                        lease.beat()
                except Exception as exc:  # a failed beat: retried next time, expiry decides
                    if time.monotonic() - lease._last_beat > ttl_s:
                        lease.lost = f"heartbeat failed: {exc}"
                if lease.lost:
                    return

        thread = threading.Thread(target=heartbeat, name=f"lease-{run_id}", daemon=True)
        thread.start()
        try:
            yield lease
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(Exception):
                lease.release()
    finally:
        con.close()
