"""Online-Mind2Web imports of hostile or careless folders: each bad folder is that folder's
reported error, the rest imports, and the run ends with a status that says what happened."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.warehouse.test_om2w import make_task
from warehouse import Warehouse
from warehouse.interop import om2w
from warehouse.records import Run, Task, Trajectory


def _result(folder: Path, **changes) -> None:
    path = folder / "result.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**result, **changes}), encoding="utf-8")


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    root = tmp_path / "om2w"
    make_task(root, "good", n_shots=2, n_actions=2)
    _result(make_task(root, "nul_id", 1, 1), task_id="a\x00b")
    _result(make_task(root, "huge_sample", 1, 1), webloop={"sample_idx": 2**70})
    _result(make_task(root, "negative_sample", 1, 1), webloop={"sample_idx": -1})
    surrogate = make_task(root, "surrogate", 1, 1)
    (surrogate / "result.json").write_text(
        '{"task_id": "s1", "task": "bad \\ud800 text", "action_history": []}', encoding="utf-8"
    )
    digits = make_task(root, "big_number", 1, 1)  # more digits than Python's int() takes
    (digits / "result.json").write_text(
        '{"task_id": "n1", "task": "t", "x": ' + "9" * 5000 + "}", encoding="utf-8"
    )
    # a folder name that is not UTF-8 (bytes from another system), with a valid task inside
    valid = make_task(root, "renamed", 1, 1)
    os.rename(os.fsencode(valid), os.fsencode(root) + b"/bad\xffname")
    return root


def test_each_hostile_folder_is_its_own_error_and_the_run_completes(
    wh: Warehouse, hostile: Path
) -> None:
    rep = om2w.import_om2w(wh, hostile, run_name="hostile")
    reasons = dict(rep.malformed)
    assert "'task_id' holds '\\x00', not a printable character" in reasons["nul_id"]
    assert "'webloop.sample_idx' must be an integer from 0" in reasons["huge_sample"]
    assert "'webloop.sample_idx' must be an integer from 0" in reasons["negative_sample"]
    assert "'task' holds text that is not valid Unicode" in reasons["surrogate"]
    assert "not valid JSON" in reasons["big_number"]
    assert reasons["b'bad\\xffname'"] == "the folder name is not valid UTF-8"
    assert len(reasons) == 6, reasons
    assert [t.task_id for t in wh.records(Trajectory)] == ["good"]
    (run,) = [r for r in wh.records(Run) if r.run_id == "hostile"]
    assert run.status == "completed" and run.ended_at is not None and run.error is None
    # every name in the report prints: no control character, no lone surrogate
    for name, reason in rep.malformed:
        assert name.isprintable() and reason.encode("utf-8")


def test_an_import_that_stops_ends_its_run_failed_with_the_error(
    wh: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "om2w"
    make_task(root, "t1", 1, 1)

    def broken(*args, **kwargs):  # a warehouse that fails mid-import (disk full, say)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wh, "write_trajectories", broken)
    with pytest.raises(OSError, match="No space left"):
        om2w.import_om2w(wh, root, run_name="stopped")
    (run,) = [r for r in wh.records(Run) if r.run_id == "stopped"]
    assert run.status == "failed" and "No space left on device" in (run.error or "")


def test_duplicate_task_ids_are_reported_and_task_versions_stay_put(
    wh: Warehouse, tmp_path: Path
) -> None:
    root = tmp_path / "om2w"
    make_task(root, "a_first", 1, 1)
    _result(make_task(root, "b_same_sample", 1, 1), task_id="a_first")
    changed = make_task(root, "c_other_text", 1, 1)
    _result(changed, task_id="a_first", task="another task", webloop={"sample_idx": 1})
    second = make_task(root, "d_second_sample", 1, 1)
    text = "Find the opening hours of store a_first ✓"
    _result(second, task_id="a_first", task=text, webloop={"sample_idx": 2})
    for run in ("first", "again"):
        rep = om2w.import_om2w(wh, root, run_name=run)
        reasons = dict(rep.malformed)
        assert (
            "task id 'a_first' (sample 0) is already imported from the folder a_first"
            in (reasons["b_same_sample"])
        )
        assert "another task text or website in the folder a_first" in reasons["c_other_text"]
        assert len(rep.imported) == 2 and len(reasons) == 2
    versions = {t.version for t in wh.records(Task) if t.task_id == "a_first"}
    assert versions == {1}  # imported twice, one version
    trajs = [t for t in wh.records(Trajectory) if t.task_id == "a_first"]
    assert len(trajs) == 4 and {t.task_version for t in trajs} == {1}
