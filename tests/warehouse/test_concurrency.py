"""Three processes at once on one warehouse: a batch writer, a labeller, an ad-hoc reader.

Run against the default SQLite catalog and a PostgreSQL catalog: no error reaches the user,
nothing is lost, no reader ever sees half a batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig

WORKER = Path(__file__).with_name("concurrency_worker.py")
BATCHES, PER_BATCH, STEPS = 30, 8, 12


def run_three(cfg: WarehouseConfig, env_url: str, tmp_path: Path) -> dict:
    with Warehouse.open(cfg):  # create the schema first, as `webloop` would
        pass
    env = {
        **os.environ,
        "WEBLOOP_HOME": str(cfg.home),
        "WEBLOOP_WAREHOUSE": env_url,
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    stop = tmp_path / "writer-done"
    nums = [str(BATCHES), str(PER_BATCH), str(STEPS)]
    procs = {
        role: subprocess.Popen(
            [sys.executable, str(WORKER), role, str(stop), *nums],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in ("labeller", "reader", "writer")
    }
    results = {}
    for role, proc in procs.items():
        out, errs = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{role} failed:\n{errs}"
        assert "Traceback" not in errs, f"{role} printed an error:\n{errs}"
        results[role] = json.loads(out.strip().splitlines()[-1])
    return results


def check_counts(cfg: WarehouseConfig, results: dict) -> None:
    total = BATCHES * PER_BATCH
    assert results["reader"]["violations"] == []
    # the writer waited for the reader half-way: whole passes over a half-written warehouse
    assert results["reader"]["checks"] >= 4 and results["reader"]["partial_views"] >= 1
    assert results["labeller"]["rounds"] > 1
    with Warehouse.open(cfg) as wh:
        counts = wh.sql(
            "SELECT (SELECT count(*) FROM trajectories) AS t, (SELECT count(*) FROM steps) AS s,"
            " (SELECT count(*) FROM human_labels) AS l,"
            " (SELECT count(DISTINCT traj_id) FROM human_labels) AS lt"
        ).row(0)
    assert counts == (total, total * STEPS, total, total)
    assert results["labeller"]["labelled"] == total


@pytest.mark.slow
def test_three_processes_on_the_sqlite_catalog(cfg: WarehouseConfig, tmp_path: Path):
    check_counts(cfg, run_three(cfg, "", tmp_path))


@pytest.mark.slow
@pytest.mark.postgres
def test_three_processes_on_a_postgres_catalog(
    pg_cfg: WarehouseConfig, pg_url: str, tmp_path: Path
):
    check_counts(pg_cfg, run_three(pg_cfg, pg_url, tmp_path))


@pytest.mark.postgres
def test_postgres_catalog_round_trip_and_password_never_shown(pg_cfg: WarehouseConfig):
    from warehouse.records import Run

    with Warehouse.open(pg_cfg) as wh:
        wh.write([Run(run_id="r1", kind="collect", config={"k": [1, 2]})])
        assert wh.records(Run)[0].config == {"k": [1, 2]}
    bad = WarehouseConfig.from_env(
        home=pg_cfg.home, warehouse="postgresql://postgres:hunter2@127.0.0.1:1/nope"
    )
    with pytest.raises(Exception) as info:
        Warehouse.open(bad)
    assert "cannot open the warehouse catalog" in str(info.value)
    assert "hunter2" not in str(info.value)
