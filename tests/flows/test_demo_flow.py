"""The demo flow, through a real (temporary) Prefect server, real Chromium and the sites.

The flow runs once on the session's sites server and Chromium (lent to it); the re-run gets
nothing lent and must not need anything: every stage finds its work stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows import collect as collect_module
from flows import score_steps as score_steps_module
from warehouse import Warehouse, WarehouseConfig
from warehouse.migrations import latest_version

pytestmark = pytest.mark.browser


def refuse(*args, **kwargs):
    raise AssertionError("started a sites server or browsers although nothing was left to do")


def test_demo_flow_collects_real_rollouts_and_is_idempotent(
    prefect_harness, sites, chromium, tmp_path: Path, monkeypatch
):
    from flows.demo import Lent, demo_flow

    home = str(tmp_path / "home")
    kw = {
        "home": home,
        "seed": 0,
        "bundled_tasks": 60,
        "collect_tasks": 4,
        "samples": 2,
        "concurrency": 2,
        "prm_states": 3,
        "prm_k": 2,
    }
    lent = Lent(sites, chromium.browser, chromium.run)
    state = demo_flow(**kw, lent=lent, return_state=True)
    assert state.is_completed()
    out = state.result()
    assert out["bundled"]["generated"] == 60 and out["bundled"]["new"] == 60
    assert out["collected"]["ran"] == 8
    assert set(out["collected"]["by_status"]) <= {"success", "failure"}
    assert sum(r["trajectories"] for r in out["summary"]) == 8
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        assert wh.sql("SELECT count(*) FROM trajectories").item() == 8
        assert wh.sql("SELECT count(*) FROM tasks WHERE suite = 'bundled'").item() == 60
        steps = wh.sql("SELECT count(*) FROM steps").item()
        assert steps == out["collected"]["steps"] > 0
        shot = wh.sql("SELECT screenshot_hash FROM steps LIMIT 1").item()
        assert wh.blobs.get(shot).startswith(b"\x89PNG")
        assert wh.sql("SELECT status FROM runs WHERE kind = 'collect'").item() == "completed"
        verdicts = wh.sql("SELECT count(*) FROM judgments WHERE judge = 'programmatic'").item()
        assert verdicts == 8 == out["judged"]["judged"]
        assert out["scored"]["states"] == 3 and out["scored"]["errors"] == 0
        assert wh.sql("SELECT count(*) FROM step_scores WHERE scorer = 'exact'").item() == 6
        # the curated dataset: judged successes only (expert samples that made no mistake are
        # one trajectory twice: deduplicated), every step an SFT example, members registered
        successes = wh.sql(
            "SELECT count(*) FROM judgments WHERE judge = 'programmatic' AND verdict = 'success'"
        ).item()
        ds = out["dataset"]
        assert 0 < ds["counts"]["trajectories"] <= successes
        members = wh.sql(
            "SELECT count(*) FROM dataset_members WHERE dataset_id = ? AND step_idx IS NOT NULL",
            [ds["dataset_id"]],
        ).item()
        assert ds["counts"]["sft"] == ds["counts"]["steps"] == members > 0
    # the re-run: nothing lent, and starting a server, the engine or the exact scorer fails it
    monkeypatch.setattr(collect_module, "SiteServer", refuse)
    monkeypatch.setattr(collect_module, "Engine", refuse)
    monkeypatch.setattr(score_steps_module, "_exact_scorer", refuse)
    again = demo_flow(**kw)
    assert again["collected"]["ran"] == 0 and again["collected"]["skipped"] == 8
    assert again["judged"]["judged"] == 0 and again["scored"]["states"] == 0  # nothing redone
    assert again["dataset"]["dataset_id"] == ds["dataset_id"]  # same data, same dataset


def test_demo_tasks_run_without_the_engine(tmp_path: Path):
    from flows.demo import generate_bundled_tasks, prepare_warehouse

    home = str(tmp_path / "h")
    assert prepare_warehouse.fn(home)["schema_version"] == latest_version()
    assert generate_bundled_tasks.fn(home, 30, 1)["generated"] == 30
