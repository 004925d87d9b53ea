"""Online-Mind2Web import / export: round trip, labels, malformed folders."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from warehouse import Warehouse, WarehouseError
from warehouse.interop import om2w
from warehouse.records import HumanLabel, Step, Task, Trajectory


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 20), color).save(buf, format="PNG")
    return buf.getvalue()


def make_task(root: Path, task_id: str, n_shots: int, n_actions: int, **extra) -> Path:
    folder = root / task_id
    (folder / "trajectory").mkdir(parents=True)
    for i in range(n_shots):  # names sort wrong as strings (10 < 2): order must be numeric
        (folder / "trajectory" / f"{i}_full_screenshot.png").write_bytes(png((i * 20, 5, 9)))
    result = {
        "task_id": task_id,
        "task": f"Find the opening hours of store {task_id} ✓",
        "final_result_response": f"Open 9-5 ({task_id})",
        "action_history": [f"<button> Step {i} -> CLICK" for i in range(n_actions)],
        "thoughts": [f"thinking {i}" for i in range(n_actions)],
        **extra,
    }
    (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return folder


@pytest.fixture
def om2w_dir(tmp_path: Path) -> Path:
    root = tmp_path / "om2w"
    make_task(root, "a1b2", n_shots=12, n_actions=11)
    make_task(root, "c3d4", n_shots=3, n_actions=3, website="https://www.example.com/")
    make_task(root, "e5f6", n_shots=2, n_actions=1)
    (root / "no_result").mkdir()
    bad = make_task(root, "bad_json", 1, 1)
    (bad / "result.json").write_text("{not json")
    missing = make_task(root, "missing_task", 1, 1)
    (missing / "result.json").write_text(json.dumps({"task_id": "missing_task"}))
    shots = make_task(root, "no_shots", 1, 1)
    for p in (shots / "trajectory").iterdir():
        p.unlink()
    (shots / "trajectory").rmdir()
    listy = make_task(root, "bad_actions", 1, 1)
    (listy / "result.json").write_text(
        json.dumps({"task_id": "x", "task": "t", "action_history": "click"})
    )
    (root / "human_label.json").write_text("[]")  # a stray file in the root is ignored
    return root


def test_import_reports_malformed_folders_and_imports_the_rest(wh: Warehouse, om2w_dir: Path):
    rep = om2w.import_om2w(wh, om2w_dir, run_name="om2w-run")
    assert len(rep.imported) == 3
    reasons = dict(rep.malformed)
    assert reasons["no_result"] == "no result.json"
    assert "not valid JSON" in reasons["bad_json"]
    assert "'task' is missing" in reasons["missing_task"]
    assert "no trajectory/ folder" in reasons["no_shots"]
    assert "'action_history' must be a list" in reasons["bad_actions"]
    assert len(reasons) == 5

    trajs = {t.task_id: t for t in wh.records(Trajectory)}
    assert trajs["a1b2"].n_steps == 12 and trajs["a1b2"].answer == "Open 9-5 (a1b2)"
    assert trajs["a1b2"].status == "finished"
    s = wh.read(Step, "traj_id = ?", [trajs["a1b2"].traj_id]).sort("step_idx")
    assert s["action_text"].to_list()[:2] == [
        "<button> Step 0 -> CLICK",
        "<button> Step 1 -> CLICK",
    ]
    assert s["action_text"].to_list()[-1] is None  # 12 screenshots, 11 actions
    # numeric order: the 10th screenshot is step 10, not step 2
    assert wh.blobs.get(s["screenshot_hash"][10]) == png((200, 5, 9))
    tasks = {t.task_id: t for t in wh.records(Task)}
    assert tasks["c3d4"].site == "https://www.example.com/" and tasks["a1b2"].suite == "om2w"
    # re-import is idempotent
    again = om2w.import_om2w(wh, om2w_dir, run_name="om2w-run")
    assert len(again.imported) == 3
    assert wh.count(Trajectory) == 3 and wh.count(Step) == 12 + 3 + 2


def test_human_labels_map_0_1_2(wh: Warehouse, om2w_dir: Path, tmp_path: Path):
    labels = tmp_path / "human_label.json"
    labels.write_text(
        json.dumps(
            [
                {"task_id": "a1b2", "task": "…", "Operator": 1, "SeeAct": 0},
                {"task_id": "c3d4", "task": "…", "Operator": 2, "SeeAct": 1},
                {"task_id": "e5f6", "task": "…", "Operator": 7, "SeeAct": 1},
                {"task_id": "zzzz", "task": "…", "Operator": 0, "SeeAct": 0},
            ]
        )
    )
    with pytest.raises(WarehouseError, match="pick --agent"):
        om2w.import_om2w(wh, om2w_dir, labels=labels, run_name="r")
    rep = om2w.import_om2w(wh, om2w_dir, labels=labels, run_name="r", agent="Operator")
    assert rep.labels_written == 2
    assert any("label 7 is not 0, 1 or 2" in p for p in rep.label_problems)
    assert any("zzzz" in p and "not among the imported" in p for p in rep.label_problems)
    got = wh.sql(
        "SELECT k.task_id, l.label FROM human_labels l JOIN trajectories t USING "
        "(traj_id) JOIN tasks k ON k.task_id = t.task_id ORDER BY 1"
    )
    assert got.rows() == [("a1b2", "success"), ("c3d4", "not_executable")]
    assert all(r.policy == "Operator" for r in wh.records(Trajectory))


def test_label_file_shapes(tmp_path: Path):
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"t1": 1, "t2": 0}))
    assert om2w.read_labels(p) == {"t1": 1, "t2": 0}
    p.write_text(json.dumps({"AgentA": {"t1": 2}, "AgentB": {"t1": 0}}))
    assert om2w.read_labels(p, "AgentB") == {"t1": 0}
    p.write_text(json.dumps([{"task_id": "t1", "label": 1}]))
    assert om2w.read_labels(p) == {"t1": 1}
    p.write_text("{oops")
    with pytest.raises(WarehouseError, match="cannot read human labels"):
        om2w.read_labels(p)
    p.write_text(json.dumps([{"no_task": 1}]))
    with pytest.raises(WarehouseError, match="entry 0 is not an object with a task_id"):
        om2w.read_labels(p)


def _by_task(wh: Warehouse, run_id: str) -> dict:
    out = {}
    for t in wh.records(Trajectory, "run_id = ?", [run_id]):
        s = wh.read(Step, "traj_id = ?", [t.traj_id]).sort("step_idx")
        out[t.task_id] = (
            t.answer,
            t.n_steps,
            s.select("step_idx", "thought", "action_text", "screenshot_hash").rows(),
        )
    return out


def test_import_export_import_round_trip(wh: Warehouse, om2w_dir: Path, tmp_path: Path):
    om2w.import_om2w(wh, om2w_dir, run_name="first")
    out = tmp_path / "exported"
    rep = om2w.export_om2w(wh, "first", out, schema="v1")
    assert sorted(p.name for p in rep.folders) == ["a1b2", "c3d4", "e5f6"]
    result = json.loads((out / "a1b2" / "result.json").read_text())
    assert result["task"] == "Find the opening hours of store a1b2 ✓"
    assert len(result["action_history"]) == 11
    assert len(list((out / "a1b2" / "trajectory").glob("*.png"))) == 12
    om2w.import_om2w(wh, out, run_name="second")
    assert _by_task(wh, "second") == _by_task(wh, "first")
    assert wh.count(HumanLabel) == 0


def test_export_of_several_samples_per_task_keeps_them_apart(wh: Warehouse, tmp_path: Path):
    from warehouse import sample

    data = sample.generate(seed=3, n_tasks=2, samples=2)
    sample.load(wh, data)
    rep = om2w.export_om2w(wh, data.run.run_id, tmp_path / "out")
    assert len(rep.folders) == 4 and all("__s" in p.name for p in rep.folders)
    back = om2w.import_om2w(wh, tmp_path / "out", run_name="back")
    assert len(back.imported) == 4 and back.malformed == []
    samples = sorted(t.sample_idx for t in wh.records(Trajectory, "run_id = 'back'"))
    assert samples == [0, 0, 1, 1]


def test_export_of_an_unknown_run_is_a_clear_error(wh: Warehouse, tmp_path: Path):
    with pytest.raises(WarehouseError, match="has no trajectories"):
        om2w.export_om2w(wh, "nope", tmp_path)


def test_import_of_a_missing_folder_is_a_clear_error(wh: Warehouse, tmp_path: Path):
    with pytest.raises(WarehouseError, match="not a folder"):
        om2w.import_om2w(wh, tmp_path / "nope")


# -- hardening: export folder names, symlinks and non-image screenshots on import ----------------


def _files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*")} if path.exists() else set()


def test_export_never_writes_outside_out_and_keeps_colliding_ids_apart(
    wh: Warehouse, tmp_path: Path
):
    src = tmp_path / "src"
    ids = ["..", ".", "a/b", "a_b", "a b", "A_B", "../../escape", "x" * 300, "ok-1"]
    for i, task_id in enumerate(ids):
        make_task(src, f"f{i}", n_shots=1, n_actions=1)
        result = json.loads((src / f"f{i}" / "result.json").read_text())
        result["task_id"] = task_id
        (src / f"f{i}" / "result.json").write_text(json.dumps(result))
    rep = om2w.import_om2w(wh, src, run_name="odd-ids")
    assert len(rep.imported) == len(ids) and rep.malformed == []

    parent = tmp_path / "nest"
    out = parent / "out"
    before = _files_under(tmp_path) - _files_under(parent)
    exported = om2w.export_om2w(wh, "odd-ids", out)
    assert _files_under(parent) - _files_under(out) == {out}  # nothing beside OUT
    assert _files_under(tmp_path) - _files_under(parent) == before | {parent}  # nor above it
    names = [p.name for p in exported.folders]
    assert len(set(n.casefold() for n in names)) == len(ids)  # unique, even case-insensitively
    for folder in exported.folders:
        assert folder.resolve().parent == out.resolve()
        assert not folder.name.startswith(".") and len(folder.name) <= 120
        assert re.fullmatch(r"[A-Za-z0-9._-]+", folder.name)
    assert {
        json.loads((f / "result.json").read_text())["task_id"] for f in exported.folders
    } == set(ids)
    assert (out / "ok-1").is_dir()  # a safe, unique id keeps its plain name
    back = om2w.import_om2w(wh, out, run_name="odd-ids-back")
    assert back.malformed == [] and {
        t.task_id for t in wh.records(Trajectory, "run_id = 'odd-ids-back'")
    } == set(ids)


def test_export_does_not_write_through_links_planted_in_out(
    wh: Warehouse, om2w_dir: Path, tmp_path: Path
):
    om2w.import_om2w(wh, om2w_dir, run_name="first")
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "a1b2").symlink_to(elsewhere, target_is_directory=True)
    victim = tmp_path / "victim.json"
    victim.write_text("keep")
    (out / "c3d4").mkdir()
    (out / "c3d4" / "result.json").symlink_to(victim)
    with pytest.raises(WarehouseError, match="link"):
        om2w.export_om2w(wh, "first", out)
    assert list(elsewhere.iterdir()) == [] and victim.read_text() == "keep"


def _mixed_folder_set(tmp_path: Path) -> Path:
    """Valid screenshots, non-image .png files and symlinks (inside and leaving the folder)."""
    root = tmp_path / "mixed"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.png").write_bytes(png((1, 2, 3)))  # a real image, but not the folder's
    (outside / "notes.txt").write_text("password=hunter2")
    (outside / "result.json").write_text(json.dumps({"task_id": "stolen", "task": "x"}))
    (outside / "shots").mkdir()
    (outside / "shots" / "0.png").write_bytes(png((4, 5, 6)))

    good = make_task(root, "good", n_shots=3, n_actions=3)
    assert good.exists()
    junk = make_task(root, "junk", n_shots=6, n_actions=6)
    shots = junk / "trajectory"
    (shots / "1_full_screenshot.png").write_bytes(png((9, 9, 9))[:-30])  # truncated
    (shots / "2_full_screenshot.png").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n"
    )
    (shots / "3_full_screenshot.png").write_bytes(b"")  # zero bytes
    (shots / "4_full_screenshot.png").write_text("<html>rate limited</html>")
    links = make_task(root, "links", n_shots=5, n_actions=5)
    shots = links / "trajectory"
    (links / "extra.png").write_bytes(png((7, 7, 7)))
    (shots / "1_full_screenshot.png").unlink()
    (shots / "1_full_screenshot.png").symlink_to(links / "extra.png")  # inside: fine
    (shots / "2_full_screenshot.png").unlink()
    (shots / "2_full_screenshot.png").symlink_to(outside / "private.png")  # leaves the folder
    (shots / "3_full_screenshot.png").unlink()
    (shots / "3_full_screenshot.png").symlink_to(outside / "notes.txt")
    (shots / "4_full_screenshot.png").unlink()
    (shots / "4_full_screenshot.png").symlink_to("../../good/trajectory/0_full_screenshot.png")
    # Links at the folder level: result.json, trajectory/ or the whole task folder elsewhere.
    r = make_task(root, "linked_result", n_shots=1, n_actions=1)
    (r / "result.json").unlink()
    (r / "result.json").symlink_to(outside / "result.json")
    t = make_task(root, "linked_shots", n_shots=1, n_actions=1)
    for p in (t / "trajectory").iterdir():
        p.unlink()
    (t / "trajectory").rmdir()
    (t / "trajectory").symlink_to(outside / "shots", target_is_directory=True)
    (root / "linked_folder").symlink_to(outside, target_is_directory=True)
    return root


def test_import_of_a_mixed_folder_set_keeps_trajectories_and_stores_only_images(
    wh: Warehouse, tmp_path: Path
):
    from warehouse.images import validate_image
    from warehouse.records import Blob

    root = _mixed_folder_set(tmp_path)
    rep = om2w.import_om2w(wh, root, run_name="mixed")

    trajs = {t.task_id: t for t in wh.records(Trajectory, "run_id = 'mixed'")}
    assert set(trajs) == {"good", "junk", "links"}  # every trajectory with its own files kept
    for task_id, n in (("good", 3), ("junk", 6), ("links", 5)):
        t = trajs[task_id]
        assert t.n_steps == n and t.answer == f"Open 9-5 ({task_id})"
        s = wh.read(Step, "traj_id = ?", [t.traj_id]).sort("step_idx")
        assert s["action_text"].to_list() == [f"<button> Step {i} -> CLICK" for i in range(n)]
        assert s["thought"].to_list() == [f"thinking {i}" for i in range(n)]
    shots = {
        task_id: wh.read(Step, "traj_id = ?", [t.traj_id]).sort("step_idx")["screenshot_hash"]
        for task_id, t in trajs.items()
    }
    assert shots["good"].null_count() == 0
    assert shots["junk"].is_null().to_list() == [False, True, True, True, True, False]
    assert shots["links"].is_null().to_list() == [False, False, True, True, True]
    assert wh.blobs.get(shots["links"][1]) == png((7, 7, 7))  # the link inside the folder

    # 0 non-images stored as images: every stored blob and every referenced screenshot decodes
    for b in wh.records(Blob):
        assert validate_image(wh.blobs.get(b.hash), decode=True) is None, b
        assert b.media_type == "image/png"
    stored = {wh.blobs.get(h) for h in wh.blobs}
    assert png((1, 2, 3)) not in stored and png((4, 5, 6)) not in stored  # nothing from outside
    assert all(b"hunter2" not in data for data in stored)

    # the report, per folder
    by_folder = rep.rejected_by_folder()
    assert set(by_folder) == {"junk", "links"}
    junk = dict(by_folder["junk"])
    assert "truncated PNG" in junk["1_full_screenshot.png"]
    assert "git-lfs pointer" in junk["2_full_screenshot.png"]
    assert "empty file" in junk["3_full_screenshot.png"]
    assert "not a PNG" in junk["4_full_screenshot.png"]
    links = dict(by_folder["links"])
    assert set(links) == {"2_full_screenshot.png", "3_full_screenshot.png", "4_full_screenshot.png"}
    assert all("leaves the task folder" in why for why in links.values())
    malformed = dict(rep.malformed)
    assert "result.json" in malformed["linked_result"] and "leaves" in malformed["linked_result"]
    assert "trajectory" in malformed["linked_shots"] and "leaves" in malformed["linked_shots"]
    assert "leaves the import folder" in malformed["linked_folder"]
    assert "stolen" not in {t.task_id for t in wh.records(Trajectory)}


@pytest.mark.parametrize(
    ("website", "kept"),
    [
        ("https://www.example.com/", True),
        ("file:///etc/passwd", False),
        ("javascript:alert(1)", False),
        ("http://", False),
        (["not", "a", "string"], False),
    ],
)
def test_only_web_urls_become_start_urls(wh: Warehouse, tmp_path: Path, website, kept: bool):
    make_task(tmp_path / "src", "t1", n_shots=1, n_actions=1, website=website)
    om2w.import_om2w(wh, tmp_path / "src", run_name="urls")
    task = wh.records(Task)[0]
    assert (task.start_url == website) is kept and (task.site == website) is kept
    assert kept or task.start_url == ""
