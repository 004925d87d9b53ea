"""Run records: running → completed / failed, with the start time kept."""

from __future__ import annotations

import datetime as dt

import pytest

from flows import runs
from flows.runs import recorded_run
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
    assert done.code_version and done.code_version != ""


def test_a_failed_run_records_the_error_and_reraises(wh, clock):
    with pytest.raises(RuntimeError, match="boom"), recorded_run(wh, "r2", "score_steps", {}):
        raise RuntimeError("boom")
    (failed,) = wh.records(Run)
    assert failed.status == "failed" and failed.error == "RuntimeError: boom"
    assert (failed.started_at, failed.ended_at) == (T0, T1)
