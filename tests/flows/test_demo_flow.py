"""The demo flow, through a real (temporary) Prefect server."""

from __future__ import annotations

from pathlib import Path

from warehouse import Warehouse, WarehouseConfig


def test_demo_flow_loads_the_sample_and_is_idempotent(prefect_harness, tmp_path: Path):
    from flows.demo import demo_flow

    home = str(tmp_path / "home")
    state = demo_flow(home=home, seed=0, n_tasks=8, samples=2, return_state=True)
    assert state.is_completed()
    out = state.result()
    assert out["loaded"]["trajectories"] == 16 and out["loaded"]["rows_inserted"] > 0
    assert sum(r["trajectories"] for r in out["summary"]) == 16
    assert out["bundled"]["generated"] == 200 and out["bundled"]["new"] == 200
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        assert wh.sql("SELECT count(*) FROM trajectories").item() == 16
        assert wh.sql("SELECT count(*) FROM tasks WHERE suite = 'bundled'").item() == 200
        steps = wh.sql("SELECT count(*) FROM steps").item()
        assert steps == out["loaded"]["steps"]
        shot = wh.sql("SELECT screenshot_hash FROM steps LIMIT 1").item()
        assert wh.blobs.get(shot).startswith(b"\x89PNG")
    again = demo_flow(home=home, seed=0, n_tasks=8, samples=2)
    assert again["loaded"]["rows_inserted"] == 0


def test_demo_tasks_run_without_the_engine(tmp_path: Path):
    from flows.demo import load_sample, prepare_warehouse

    home = str(tmp_path / "h")
    assert prepare_warehouse.fn(home)["schema_version"] == 1
    assert load_sample.fn(home, 1, 4, 1)["trajectories"] == 4
