"""Run records: running → completed / failed, with the start time kept."""

from __future__ import annotations

import time

import pytest

from flows.runs import recorded_run
from warehouse.records import Run


def test_a_run_keeps_its_start_time_and_records_its_end(wh):
    with recorded_run(wh, "r1", "judge", {"k": 1}, name="n"):
        (running,) = wh.records(Run)
        assert running.status == "running" and running.ended_at is None
        time.sleep(0.05)
    (done,) = wh.records(Run)
    assert done.status == "completed" and done.name == "n" and done.config == {"k": 1}
    assert done.started_at == running.started_at < done.ended_at
    assert done.code_version and done.code_version != ""


def test_a_failed_run_records_the_error_and_reraises(wh):
    with pytest.raises(RuntimeError, match="boom"), recorded_run(wh, "r2", "score_steps", {}):
        raise RuntimeError("boom")
    (failed,) = wh.records(Run)
    assert failed.status == "failed" and failed.error == "RuntimeError: boom"
    assert failed.ended_at is not None
