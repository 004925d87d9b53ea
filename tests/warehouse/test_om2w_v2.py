"""Online-Mind2Web schema v2: import of every screenshot form the schema allows, the upstream
rules per folder, and an export that the upstream reading rules read back the same."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from warehouse import Warehouse
from warehouse.interop import om2w
from warehouse.records import Step, Task, Trajectory

V2 = "online-mind2web-v2"


def png(color: tuple[int, int, int], size: tuple[int, int] = (24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def jpeg(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), color).save(buf, format="JPEG")
    return buf.getvalue()


def step(i: int, action: str, shot: str, **kw: Any) -> dict[str, Any]:
    return {
        "step": i,
        "screenshot": shot,
        "url": f"https://shop.example.com/p{i}",
        "action": action,
        "action_status": "SUCCESS",
        "thought": f"thought {i}",
        **kw,
    }


def write_folder(root: Path, name: str, result: dict[str, Any], files: dict[str, bytes]) -> Path:
    folder = root / name
    (folder / "trajectory").mkdir(parents=True)
    for fname, data in files.items():
        (folder / "trajectory" / fname).write_bytes(data)
    (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return folder


def v2_result(task_id: str, steps: list[dict[str, Any]], answer: str | None, **kw: Any) -> dict:
    return {
        "schema_version": V2,
        "task_id": task_id,
        "task": f"Find the price of {task_id}",
        "reference_length": 7,
        "agent_final_answer": answer,
        "action_history": steps,
        **kw,
    }


def data_uri(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture
def v2_dir(tmp_path: Path) -> Path:
    """Three valid v2 folders (files; data URIs and bare base64; a URL), a v1 folder beside
    them, and five v2 folders that each break one rule."""
    root = tmp_path / "v2"
    files = {
        "0000.png": png((200, 0, 0)),
        "0001.png": png((0, 200, 0)),
        "0002.jpg": jpeg((0, 0, 200)),
        "0003.png": png((9, 9, 9)),
    }
    steps = [
        step(0, "[link] Deals -> CLICK", "0000.png"),
        step(1, "[textbox] Search -> TYPE: mug", "0001.png", thought=None),
        step(2, "[button] Go -> CLICK", "0002.jpg", action_status="FAILED"),
        step(3, "TASK_COMPLETE -> ANSWER: The mug costs $12.", "0003.png"),
    ]
    write_folder(root, "files", v2_result("files", steps, "The mug costs  $12."), files)
    inline = [
        step(0, "[link] Home -> CLICK", data_uri(png((1, 2, 3)))),
        step(1, "[button] Cart -> CLICK", base64.b64encode(jpeg((4, 5, 6))).decode()),
        step(2, "TASK_COMPLETE -> ANSWER: ", data_uri(png((7, 8, 9)), "png")),
    ]
    folder = write_folder(root, "inline", v2_result("inline", inline, None), {})
    (folder / "trajectory").rmdir()  # inline screenshots need no trajectory/ folder
    remote = [
        step(0, "[link] About -> CLICK", "https://cdn.example.com/shot0.png"),
        step(1, "TASK_COMPLETE -> ANSWER: closed", "1.png"),
    ]
    write_folder(root, "remote", v2_result("remote", remote, "closed"), {"1.png": png((5, 5, 5))})
    v1 = {
        "task_id": "old",
        "task": "Old layout",
        "final_result_response": "ok",
        "action_history": ["a -> CLICK"],
        "thoughts": ["t"],
    }
    write_folder(root, "v1", v1, {"0.png": png((3, 3, 3))})
    bad = {
        "gap": [
            step(0, "a -> CLICK", "0000.png"),
            step(2, "TASK_COMPLETE -> ANSWER: x", "0000.png"),
        ],
        "nothought": [
            {k: v for k, v in step(0, "a -> CLICK", "0000.png").items() if k != "thought"},
            step(1, "TASK_COMPLETE -> ANSWER: x", "0000.png"),
        ],
        "answer": [
            step(0, "a -> CLICK", "0000.png"),
            step(1, "TASK_COMPLETE -> ANSWER: y", "0000.png"),
        ],
        "nofinal": [step(0, "a -> CLICK", "0000.png"), step(1, "b -> CLICK", "0000.png")],
        "early": [
            step(0, "TASK_COMPLETE -> ANSWER: x", "0000.png"),
            step(1, "TASK_COMPLETE -> ANSWER: x", "0000.png"),
        ],
    }
    for name, s in bad.items():
        write_folder(root, name, v2_result(name, s, "x"), {"0000.png": png((1, 1, 1))})
    return root


def test_v2_folders_import_with_their_actions_thoughts_answer_and_every_screenshot_form(
    wh: Warehouse, v2_dir: Path
):
    rep = om2w.import_om2w(wh, v2_dir, run_name="v2")
    reasons = dict(rep.malformed)
    assert "'step' is 2, expected 1" in reasons["gap"]
    assert "action_history[0] has no 'thought' key" in reasons["nothought"]
    assert "answer 'y' does not match 'agent_final_answer' 'x'" in reasons["answer"]
    assert "the last step's action must be 'TASK_COMPLETE" in reasons["nofinal"]
    assert "TASK_COMPLETE before the last step" in reasons["early"]
    assert len(reasons) == 5 and len(rep.imported) == 4  # three v2 folders and the v1 one
    assert rep.rejected == [("remote", "https://cdn.example.com/shot0.png", "a URL (not fetched)")]

    trajs = {t.task_id: t for t in wh.records(Trajectory, "run_id = 'v2'")}
    files = _steps(wh, trajs["files"])
    assert [s.action_text for s in files[:-1]] == [
        "[link] Deals -> CLICK",
        "[textbox] Search -> TYPE: mug",
        "[button] Go -> CLICK",
    ]  # the action strings, not the JSON of the step objects
    assert [s.thought for s in files] == ["thought 0", None, "thought 2", "thought 3"]
    assert [s.url for s in files][:2] == [
        "https://shop.example.com/p0",
        "https://shop.example.com/p1",
    ]
    assert files[2].action == {"raw": "[button] Go -> CLICK", "status": "FAILED"}
    # the final step is the answer, as webloop stores its own: not an action on the page
    assert files[-1].action == {"type": "answer", "text": "The mug costs  $12."}
    assert trajs["files"].answer == "The mug costs  $12." and trajs["files"].n_steps == 4
    shots = [wh.blobs.get(s.screenshot_hash) for s in files]
    assert shots[2] == (v2_dir / "files" / "trajectory" / "0002.jpg").read_bytes()

    inline = _steps(wh, trajs["inline"])
    assert [wh.blobs.get(s.screenshot_hash) for s in inline] == [
        png((1, 2, 3)),
        jpeg((4, 5, 6)),
        png((7, 8, 9)),
    ]  # a data URI, bare base64, a data URI
    assert trajs["inline"].answer is None

    remote = _steps(wh, trajs["remote"])
    assert remote[0].screenshot_hash is None  # a URL is not fetched: reported, kept for export
    assert remote[0].action["screenshot_url"] == "https://cdn.example.com/shot0.png"
    assert trajs["old"].n_steps == 1  # the v1 folder beside them, read as v1
    task = wh.records(Task, "task_id = 'files'")[0]
    assert task.difficulty == 7  # reference_length, where om2w task files keep it


def _steps(wh: Warehouse, t: Trajectory) -> list[Step]:
    return sorted(wh.records(Step, "traj_id = ?", [t.traj_id]), key=lambda s: s.step_idx)


# -- the upstream reading rules (OSU-NLP-Group/Online-Mind2Web src/run.py, v2 branch) ------------


def upstream_read(folder: Path) -> dict[str, Any]:
    """What the upstream judge reads from a v2 folder: every step's action but the last, every
    step's thought and screenshot, and ``agent_final_answer``; a screenshot as its bytes (a file
    under ``trajectory/``, a data URI or base64) or, for a URL, the URL."""
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    assert result["schema_version"] == V2
    steps = result["action_history"]
    return {
        "task": result["task"],
        "actions": [s["action"] for s in steps[:-1]],
        "thoughts": [s.get("thought") or None for s in steps],
        "screenshots": [_shot(folder, s["screenshot"]) for s in steps],
        "answer": result.get("agent_final_answer"),
    }


def _shot(folder: Path, ref: str) -> bytes | str:
    if ref.startswith("data:"):
        return base64.b64decode(ref.split(",", 1)[1])
    if ref.startswith("https://"):
        return ref
    path = folder / "trajectory" / ref
    return path.read_bytes() if path.is_file() else base64.b64decode(ref)


def test_a_v2_export_reads_back_the_same_by_the_upstream_rules(
    wh: Warehouse, v2_dir: Path, tmp_path: Path
):
    om2w.import_om2w(wh, v2_dir, run_name="v2")
    out = tmp_path / "out"
    rep = om2w.export_om2w(wh, "v2", out)
    assert rep.schema == "v2" and rep.skipped == []
    for name in ("files", "inline", "remote"):
        assert upstream_read(out / name) == upstream_read(v2_dir / name), name
    result = json.loads((out / "files" / "result.json").read_text())
    assert result["reference_length"] == 7  # the task's, not the trajectory's 4 steps
    assert result["action_history"][-1]["action"] == "TASK_COMPLETE -> ANSWER: The mug costs  $12."
    assert [s["step"] for s in result["action_history"]] == [0, 1, 2, 3]
    assert result["action_history"][2]["action_status"] == "FAILED"
    # the v1 trajectory gets the final answer step v2 needs, on the page it answered from
    old = json.loads((out / "old" / "result.json").read_text())["action_history"]
    assert old[-1]["action"] == "TASK_COMPLETE -> ANSWER: ok" and old[-1]["step"] == 1
    assert old[-1]["screenshot"] == old[0]["screenshot"]
    # and the export imports again, as v2, to the same steps
    again = om2w.import_om2w(wh, out, run_name="again")
    assert again.malformed == [] and len(again.imported) == 4
    first = {t.task_id: t for t in wh.records(Trajectory, "run_id = 'v2'")}
    for t in wh.records(Trajectory, "run_id = 'again'"):
        if t.task_id == "old":
            continue
        a, b = _steps(wh, first[t.task_id]), _steps(wh, t)
        assert [(s.action_text, s.thought, s.screenshot_hash, s.url) for s in a] == [
            (s.action_text, s.thought, s.screenshot_hash, s.url) for s in b
        ]
        assert first[t.task_id].answer == t.answer


def test_a_v2_export_skips_a_trajectory_without_screenshots_and_says_why(
    wh: Warehouse, tmp_path: Path
):
    from warehouse import sample

    data = sample.generate(seed=5, n_tasks=2, samples=1)
    sample.load(wh, data)
    blind = data.trajectories[0].traj_id
    wh.con.execute("UPDATE steps SET screenshot_hash = NULL WHERE traj_id = ?", [blind])
    rep = om2w.export_om2w(wh, data.run.run_id, tmp_path / "v2")
    assert [t for t, _ in rep.skipped] == [blind] and len(rep.folders) == 1
    assert "has no screenshot (v2 needs one per step" in rep.skipped[0][1]
    v1 = om2w.export_om2w(wh, data.run.run_id, tmp_path / "v1", schema="v1")
    assert len(v1.folders) == 2 and v1.skipped == []
    with pytest.raises(Exception, match="unknown Online-Mind2Web schema 'v3'"):
        om2w.export_om2w(wh, data.run.run_id, tmp_path / "v3", schema="v3")
