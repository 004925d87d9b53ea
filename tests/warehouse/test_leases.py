"""Run leases (warehouse/leases.py): one holder per run, across processes, on the SQLite and the
PostgreSQL catalog; refusal names the holder; waiting; expiry by TTL and by a killed process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig
from warehouse.leases import (
    Claim,
    LeaseHeldError,
    acquire,
    claims,
    hold,
    holder_of,
    this_host,
)

ROOT = Path(__file__).parents[2]

# One racer: waits for the start file, then tries to take each run's lease (never waits,
# never releases), prints which it won and stays alive (a dead holder's lease expires) until
# the stop file appears.
RACER = """
import json, sys, time
from pathlib import Path
from warehouse import Warehouse
from warehouse.leases import LeaseHeldError, acquire
go, runs = Path(sys.argv[1]), sys.argv[2:]
stop = go.with_name("stop")
with Warehouse.open() as wh:
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.005)
    won = []
    for run in runs:
        try:
            acquire(wh.con, run, holder="racer", ttl_s=600)
            won.append(run)
        except LeaseHeldError:
            pass
print(json.dumps(won), flush=True)
while not stop.exists():
    time.sleep(0.05)
"""

# A holder that takes a lease, says so, and sleeps until killed.
SLEEPER = """
import sys, time
from warehouse import Warehouse
from warehouse.leases import acquire
with Warehouse.open() as wh:
    acquire(wh.con, sys.argv[1], holder="sleeper", ttl_s=3600)
    print("held", flush=True)
    time.sleep(600)
"""


def env_for(cfg: WarehouseConfig, url: str = "") -> dict[str, str]:
    """A subprocess's environment for ``cfg`` (``url``: its WEBLOOP_WAREHOUSE, "" for SQLite)."""
    return {
        **os.environ,
        "WEBLOOP_HOME": str(cfg.home),
        "WEBLOOP_WAREHOUSE": url,
        "PYTHONPATH": str(ROOT),
    }


def race(
    cfg: WarehouseConfig, url: str, tmp_path: Path, n_procs: int, runs: list[str]
) -> list[tuple[int, list[str]]]:
    """Each racer's pid and the runs whose lease it won."""
    with Warehouse.open(cfg):
        pass  # schema first
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(go), *runs],
            env=env_for(cfg, url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n_procs)
    ]
    for p in procs:  # every racer has the warehouse open; the start file releases all at once
        read_until(p, "ready")
    go.touch()
    out = []
    try:
        for p in procs:
            out.append((p.pid, result_line(p)))
    finally:
        (tmp_path / "stop").touch()
        for p in procs:
            _, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, stderr
    return out


def read_until(p: subprocess.Popen, prefix: str) -> str:
    """The racer's next stdout line that starts with ``prefix`` (DuckDB may draw a progress bar
    on stdout before it)."""
    while True:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.poll() is not None else f"no {prefix!r} line"
        text = line.rsplit("\r", 1)[-1].strip()
        if text.startswith(prefix):
            return text


def result_line(p: subprocess.Popen) -> list[str]:
    """The racer's JSON line: the runs it won."""
    return json.loads(read_until(p, "["))


def check_one_winner_each(
    won: list[tuple[int, list[str]]], runs: list[str], cfg: WarehouseConfig
) -> None:
    flat = [r for _, w in won for r in w]
    assert sorted(flat) == sorted(runs)  # every run won exactly once, never twice
    with Warehouse.open(cfg) as wh:
        for run in runs:
            cs = claims(wh.con, run)
            assert len(cs) == len(won)  # every racer claimed every run
            winner = next(pid for pid, w in won if run in w)
            assert cs[0].pid == winner  # the oldest claim (commit order) won
            assert all(c.released_at is not None for c in cs[1:])  # the losers withdrew


@pytest.mark.slow  # processes race
def test_two_processes_racing_for_leases_sqlite(cfg: WarehouseConfig, tmp_path: Path):
    runs = [f"run-{i}" for i in range(4)]
    won = race(cfg, "", tmp_path, 2, runs)
    check_one_winner_each(won, runs, cfg)


def test_two_processes_racing_for_leases_postgres(
    pg_cfg: WarehouseConfig, pg_url: str, tmp_path: Path
):
    runs = [f"run-{i}" for i in range(3)]
    won = race(pg_cfg, pg_url, tmp_path, 2, runs)
    check_one_winner_each(won, runs, pg_cfg)


def test_second_claimant_is_refused_with_the_holder_named(wh: Warehouse):
    first = acquire(wh.con, "r1", holder="collect")
    other = wh.con.cursor()
    with pytest.raises(LeaseHeldError) as err:
        acquire(other, "r1", holder="collect")
    msg = str(err.value)
    assert f"host {this_host()}" in msg and f"pid {os.getpid()}" in msg and "since" in msg
    assert err.value.holder.claim_id == first.claim.claim_id
    # the refused claim was withdrawn: after the release, a new claimant gets it at once
    first.release()
    second = acquire(other, "r1")
    assert holder_of(wh.con, "r1").claim_id == second.claim.claim_id
    assert acquire(other, "another-run").claim.run_id == "another-run"  # leases are per run


def test_a_waiting_claimant_gets_the_lease_when_it_is_released(wh: Warehouse):
    first = acquire(wh.con, "r2")
    waited_for = []

    def on_wait(holder: Claim) -> None:  # the waiter saw the holder: now it lets go
        waited_for.append(holder)
        first.release()

    second = acquire(wh.con.cursor(), "r2", wait_s=60, poll_s=0.1, on_wait=on_wait)
    assert [c.claim_id for c in waited_for] == [first.claim.claim_id]
    assert holder_of(wh.con, "r2").claim_id == second.claim.claim_id


@pytest.mark.slow  # waits 1 s
def test_a_waiting_claimant_gives_up_after_its_wait(wh: Warehouse):
    acquire(wh.con, "r3")
    t0 = time.monotonic()
    with pytest.raises(LeaseHeldError, match="waited 1 s"):
        acquire(wh.con.cursor(), "r3", wait_s=1.0, poll_s=0.2)
    assert time.monotonic() - t0 >= 1.0


@pytest.mark.slow  # waits out a 2 s TTL
def test_a_lease_without_heartbeat_expires_after_its_ttl(wh: Warehouse):
    stale = acquire(wh.con, "r4", ttl_s=2.0)
    time.sleep(2.5)
    fresh = acquire(wh.con.cursor(), "r4")
    assert holder_of(wh.con, "r4").claim_id == fresh.claim.claim_id
    stale.beat()  # the stale holder notices on its next heartbeat
    assert stale.lost and "heartbeat" in stale.lost
    with pytest.raises(Exception, match="lost the lease"):
        stale.check()


@pytest.mark.slow  # waits out a 6 s TTL
def test_hold_keeps_the_lease_alive_by_heartbeat_and_releases_it(wh: Warehouse):
    ttl = 6.0
    with hold(wh, "r5", ttl_s=ttl, holder="collect") as lease:
        # wait (however long the machine takes) until a heartbeat has carried the claim past
        # the expiry of its first stamp: the thread renewed it
        deadline = time.monotonic() + 120
        while True:
            (claim,) = claims(wh.con.cursor(), "r5")
            if (claim.beat_at - claim.claimed_at).total_seconds() > ttl:
                break
            assert time.monotonic() < deadline, "no heartbeat renewed the lease"
            time.sleep(0.2)
        assert lease.lost is None
        with pytest.raises(LeaseHeldError):
            acquire(wh.con.cursor(), "r5")
    assert holder_of(wh.con, "r5") is None  # released
    assert acquire(wh.con, "r5").claim.run_id == "r5"


@pytest.mark.slow  # a holder process killed
def test_a_killed_holders_lease_expires_at_once_on_its_host(cfg: WarehouseConfig):
    with Warehouse.open(cfg):
        pass
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, "r6"],
        env=env_for(cfg),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        while not line.endswith("held"):  # DuckDB may draw a progress bar before it
            raw = proc.stdout.readline()
            assert raw, f"the holder exited: {proc.communicate(timeout=30)[1]}"
            line = raw.strip()
        with Warehouse.open(cfg) as wh:
            with pytest.raises(LeaseHeldError, match=f"pid {proc.pid}"):
                acquire(wh.con, "r6")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            # TTL is an hour: only the dead process frees it
            assert acquire(wh.con, "r6").claim.pid == os.getpid()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
