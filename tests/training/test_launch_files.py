"""The launcher's files: the job is JSON (reading it runs no code) and rebuilds the same job;
``.launch`` is private, and a link planted at any of its files' names is not followed."""

from __future__ import annotations

import json
import os
import pickle
import re
import stat
from pathlib import Path

import pytest

from training.interface import DataMismatch, Turn
from training.launch import (
    JOB_FILE,
    LAUNCH_DIR,
    Job,
    LaunchFolderRefused,
    fit_processes,
    main,
    read_job,
    write_job,
)
from training.load import ModelSpec
from training.parallel import ParallelConfig
from training.trainer import TrainConfig

PNG_A, PNG_B = b"\x89PNG\r\n\x1a\n-a", b"\x89PNG\r\n\x1a\n-b"


def a_job(out_dir: Path, model: str = "tiny") -> Job:
    """Every kind of field a job holds: images (one shared by two turns), floats whose every
    bit counts, a missing behaviour log-prob, meta, a reference model and an anchor."""
    turns = [
        Turn("Task: a", "Action: click(1)", (PNG_A, PNG_B), 0.1 + 0.2, -1 / 3, None, "t/0"),
        Turn("Task: b", "Action: stop()", (PNG_A,), 2.0, 1e-300, -0.7, "t/1", {"site": "shop"}),
    ]
    anchor = [Turn("Task: c", "Action: noop()", (), key="d/0", meta={"split": None})]
    return Job(
        model=ModelSpec(model, str(out_dir / "home"), 3, {"reasoning_weight": 0.5}),
        turns=turns,
        cfg=TrainConfig(objective="ppo", lr=3e-4, batch_size=2, kl_coef=0.1, anchor_coef=0.5),
        out_dir=str(out_dir),
        parallel=ParallelConfig("fsdp", "bf16", 2),
        ref_model=ModelSpec("tiny", str(out_dir / "home")),
        anchor=anchor,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_job_file_is_json_and_rebuilds_the_same_job(tmp_path):
    job = a_job(tmp_path / "out")
    path = write_job(job)
    assert path == tmp_path / "out" / LAUNCH_DIR / JOB_FILE
    data = json.loads(path.read_text())
    assert data["cfg"]["objective"] == "ppo" and data["parallel"]["strategy"] == "fsdp"
    assert len(data["images"]) == 2  # each distinct image once
    again = read_job(path)
    assert again == job
    assert [t.meta for t in again.turns + again.anchor] == [{}, {"site": "shop"}, {"split": None}]
    assert again.turns[0].weight == 0.1 + 0.2 and again.turns[1].advantage == 1e-300
    assert mode(path.parent) == 0o700 and mode(path) == 0o600


def test_a_pickled_job_file_runs_nothing(tmp_path):
    """A rank handed a pickle (the old ``job.pkl``, or one planted) refuses it as no job file:
    the code in it never runs."""
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    launch = tmp_path / LAUNCH_DIR
    launch.mkdir()
    planted = launch / "job.pkl"
    planted.write_bytes(pickle.dumps(Payload()))
    assert main([str(planted)]) == 1
    assert not marker.exists()
    error = json.loads((launch / "rank-0.error.json").read_text())
    assert error["type"] == "ValueError" and "not a training job file" in error["message"]


def test_links_planted_in_the_launch_folder_are_not_followed(tmp_path):
    """A world-readable ``.launch`` (as earlier versions made it) with a link at every name the
    launcher and its rank write: the run goes on (here to the model's own error), every link's
    target is unchanged, the folder is made private and its files are files."""
    out = tmp_path / "out"
    launch = out / LAUNCH_DIR
    launch.mkdir(parents=True, mode=0o755)
    os.chmod(launch, 0o755)
    names = ["job.json", "job.pkl", "rank-0.log", "rank-0.error.json", "events.jsonl"]
    targets = {}
    for name in names:
        target = tmp_path / f"precious-{name}"
        target.write_text(f"the user's own {name}")
        (launch / name).symlink_to(target)
        targets[target] = target.read_bytes()
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    with pytest.raises(DataMismatch, match=r"no config\.json"):
        fit_processes(a_job(out, str(not_a_model)), 1)
    assert {t: t.read_bytes() for t in targets} == targets
    assert mode(launch) == 0o700
    for name in ("job.json", "rank-0.log", "rank-0.error.json"):
        assert stat.S_ISREG(os.lstat(launch / name).st_mode), name
        assert mode(launch / name) == 0o600, name
    assert not (launch / "job.pkl").exists() and not (launch / "job.pkl").is_symlink()
    assert "no config.json" in (launch / "rank-0.log").read_text()


@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_launch_folder_that_is_a_link_or_a_file_is_refused(tmp_path, kind):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    if kind == "link":
        (out / LAUNCH_DIR).symlink_to(elsewhere, target_is_directory=True)
    else:
        (out / LAUNCH_DIR).write_text("in the way")
    refused = re.escape(f"{out / LAUNCH_DIR}: not a folder of its own")
    with pytest.raises(LaunchFolderRefused, match=refused):
        write_job(a_job(out))
    assert list(elsewhere.iterdir()) == [] and mode(elsewhere) == 0o755
