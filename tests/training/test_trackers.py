"""The experiment trackers' own behaviour: ``--report-to`` parsing, secrets kept out, a resumed
run logging into the same MLflow run. (Each tracker read back after a real two-process run:
tests/cli/test_train_cli.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from training.trackers import TRACKERS, TrackerError, Trackers, parse_report_to


def test_report_to_follows_the_trainer_convention_and_names_what_is_unknown():
    assert parse_report_to("none") == parse_report_to("") == ()
    assert parse_report_to("all") == TRACKERS
    assert parse_report_to("MLflow, tensorboard,mlflow") == ("mlflow", "tensorboard")
    with pytest.raises(TrackerError, match=r"unknown tracker\(s\) \['neptune'\]"):
        parse_report_to("tensorboard,neptune")


def test_no_secret_reaches_a_tracker_and_a_resumed_run_continues_its_mlflow_run(
    tmp_path: Path, monkeypatch
):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("JUDGE_API_KEY", "sk-live-0123456789")
    config = {
        "judge": {"base_url": "http://user:hunter22pass@judge.test/v1", "key": "sk-live-0123456789"}
    }
    for start in (1, 3):  # the run, then its resumption
        t = Trackers(("tensorboard", "mlflow"), root=tmp_path, run="train-x", config=config,
                     lineage={"dataset_id": "ds-1"})  # fmt: skip
        t.log(start, {"loss": 1.0 / start})
        t.log(start + 1, {"loss": 0.5 / start, "skipped": None})
        t.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("webloop").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4]
    stored = str(run.data.params) + str(run.data.tags)
    assert "sk-live" not in stored and "hunter22pass" not in stored and "***" in stored
    events = EventAccumulator(
        str(tmp_path / "tensorboard" / "train-x"), size_guidance={"tensors": 0}
    )
    events.Reload()
    text = str([e.tensor_proto.string_val for e in events.Tensors("config/text_summary")])
    assert "judge.base_url" in text and "sk-live" not in text and "hunter22pass" not in text
