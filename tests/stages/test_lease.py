"""The run lease in ``collect``: two collector processes on one run — the second is refused
(naming the holder) or waits and then finds the work done; nothing is written twice. A SIGKILLed
collector's lease expires at once on its host and a re-run proceeds.

The first collector's model (tests.flows.test_collect.GatedModel) holds its answers until
released, so it is reliably mid-run while the second one starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sites.tasks import generate
from tests.flows.integrity import duplicate_and_mismatched
from tests.flows.test_collect import GatedModel
from warehouse import Warehouse, WarehouseConfig
from warehouse.leases import claims, holder_of
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
N_TASKS, RUN = 3, "leased"

COLLECTOR = """
import asyncio, json, sys
from stages.collect import CollectConfig, run_collect
from warehouse import Warehouse
cfg = CollectConfig(**json.loads(sys.argv[1]))
with Warehouse.open() as wh:
    out = asyncio.run(run_collect(wh, cfg))
print("RESULT " + json.dumps({"ran": out.ran, "written": out.written}), flush=True)
"""


def start(home: Path, model_url: str, **extra) -> subprocess.Popen:
    cfg = dict(
        n_tasks=N_TASKS,
        policy="openai",
        base_url=model_url,
        model="gated",
        prompt_mode="a11y",
        concurrency=1,
        run_name=RUN,
        **extra,
    )
    env = {**os.environ, "WEBLOOP_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("WEBLOOP_WAREHOUSE", None)
    return subprocess.Popen(
        [sys.executable, "-c", COLLECTOR, json.dumps(cfg)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its sites server and browsers are in its process group
    )


def result(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def wait_for_holder(home: Path, pid: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first collector never took the lease"
        if (home / "lake").exists():
            with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
                h = holder_of(wh.con, RUN)
            if h is not None and h.pid == pid:
                return
        time.sleep(0.3)


def wait_for_claim(home: Path, proc: subprocess.Popen) -> None:
    """Until ``proc`` has an open (unreleased, not holding) claim on the run: it waits in line."""
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the waiting collector never claimed the run"
        with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
            mine = [c for c in claims(wh.con, RUN) if c.pid == proc.pid]
            h = holder_of(wh.con, RUN)
        if mine and mine[-1].released_at is None and h is not None and h.pid != proc.pid:
            return
        time.sleep(0.3)


def check_once_each(home: Path) -> None:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        n = wh.sql("SELECT count(*) FROM trajectories WHERE run_id = ?", [RUN]).item()
        whole = duplicate_and_mismatched(wh, RUN)
    assert n == N_TASKS and whole == (0, 0)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        put_tasks(wh, generate(30, 0))
    return home


def test_second_collector_is_refused_then_a_waiting_one_finds_the_run_done(home: Path):
    model = GatedModel(allowed=1)
    with model.http:
        first = start(home, model.url)
        procs = [first]
        try:
            wait_for_holder(home, first.pid, first)
            refused = start(home, model.url)
            _, err = refused.communicate(timeout=300)
            assert refused.returncode != 0
            assert "being written by another process" in err
            assert f"pid {first.pid}" in err and "since" in err
            waiting = start(home, model.url, lease_wait_s=600)
            procs.append(waiting)
            wait_for_claim(home, waiting)  # it claimed and queued behind the holder
            assert waiting.poll() is None  # waiting for the lease, not refused
            model.release()
            first_out = result(first)
            waiting_out = result(waiting)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    assert first_out["written"] == N_TASKS
    assert waiting_out == {"ran": 0, "written": 0}  # it waited, then found everything stored
    check_once_each(home)


def test_a_killed_collectors_lease_expires_and_a_rerun_proceeds(home: Path):
    model = GatedModel(allowed=1)
    with model.http:
        first = start(home, model.url)
        try:
            wait_for_holder(home, first.pid, first)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the collector, its browsers, its sites
            first.wait(30)
        model.release()
        rerun = result(start(home, model.url))  # no wait: the dead holder's lease is gone
    assert rerun["written"] >= N_TASKS - 1
    check_once_each(home)
