"""Run records: running → completed / failed, with the start time kept."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from stages import runs
from stages.runs import recorded_run
from warehouse.records import Run

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=7)


@pytest.fixture
def clock(monkeypatch):
    """The run's clock: T0 when it starts, T1 when it ends (no dependence on real time)."""
    ticks = iter([T0, T1])
    monkeypatch.setattr(runs, "utcnow", lambda: next(ticks))


def test_a_run_keeps_its_start_time_and_records_its_end(wh, clock):
    with recorded_run(wh, "r1", "judge", {"k": 1}, name="n"):
        (running,) = wh.records(Run)
        assert running.status == "running" and running.ended_at is None
        assert running.started_at == T0
    (done,) = wh.records(Run)
    assert done.status == "completed" and done.name == "n" and done.config == {"k": 1}
    assert (done.started_at, done.ended_at) == (T0, T1)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert done.code_version == (head.stdout.strip() or "unknown")


def test_a_failed_run_records_the_error_and_reraises(wh, clock):
    with pytest.raises(RuntimeError, match="boom"), recorded_run(wh, "r2", "score_steps", {}):
        raise RuntimeError("boom")
    (failed,) = wh.records(Run)
    assert failed.status == "failed" and failed.error == "RuntimeError: boom"
    assert (failed.started_at, failed.ended_at) == (T0, T1)


def test_ctrl_c_records_a_cancelled_run(wh, clock):
    with pytest.raises(KeyboardInterrupt), recorded_run(wh, "r3", "collect", {}):
        raise KeyboardInterrupt
    (run,) = wh.records(Run)
    assert run.status == "cancelled" and run.ended_at == T1


def test_an_orchestrators_run_is_named_in_the_config(wh, clock, monkeypatch):
    monkeypatch.setattr(runs, "orchestrator_run", lambda: "prefect-run-7")
    with recorded_run(wh, "r4", "judge", {"k": 2}):
        pass
    (run,) = wh.records(Run)
    assert run.config == {"k": 2, "flow_run_id": "prefect-run-7"}
