"""Task importers (om2w, webvoyager, rubric) and task generation into the warehouse."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sites.tasks import generate, resolve_start_url
from warehouse import Warehouse, WarehouseError
from warehouse.interop.task_formats import parse_task_file
from warehouse.records import Task
from warehouse.tasks import latest_tasks, put_tasks


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_om2w_tasks_with_malformed_rows(tmp_path: Path):
    rows = [
        {
            "task_id": "abc",
            "confirmed_task": "Find a hotel in Paris",
            "website": "https://www.booking.com/",
            "reference_length": 7,
            "level": "medium",
        },
        {"task_id": "def", "confirmed_task": "", "website": "https://x.com/"},
        {"task_id": "ghi", "confirmed_task": "Buy shoes", "website": "not a url"},
        {
            "task_id": "jkl",
            "confirmed_task": "Buy shoes",
            "website": "https://a.b/",
            "reference_length": "many",
        },
        "[1, 2",
        {"task_id": "abc", "confirmed_task": "dup", "website": "https://a.b/"},
    ]
    parsed = parse_task_file("om2w", write_jsonl(tmp_path / "om2w.jsonl", rows))
    assert [t.task_id for t in parsed.tasks] == ["abc"]
    t = parsed.tasks[0]
    assert (t.site, t.difficulty, t.meta, t.suite) == (
        "www.booking.com",
        7,
        {"level": "medium"},
        "om2w",
    )
    errors = dict(parsed.errors)
    assert "'confirmed_task' is missing" in errors[2]
    assert "not an http(s) URL" in errors[3]
    assert "'reference_length' must be an integer" in errors[4]
    assert "not valid JSON" in errors[5]
    assert "duplicate task id" in errors[6]


def test_om2w_tasks_as_a_json_array(tmp_path: Path):
    p = tmp_path / "tasks.json"
    p.write_text(
        json.dumps([{"task_id": "a", "confirmed_task": "t", "website": "https://a.b"}, "oops"])
    )
    parsed = parse_task_file("om2w", p)
    assert len(parsed.tasks) == 1 and parsed.errors == [(2, "not a JSON object")]
    p.write_text("[broken")
    with pytest.raises(WarehouseError, match="not valid JSON"):
        parse_task_file("om2w", p)


def test_webvoyager_and_rubric(tmp_path: Path):
    wv = write_jsonl(
        tmp_path / "wv.jsonl",
        [
            {
                "web_name": "Allrecipes",
                "id": "Allrecipes--0",
                "ques": "Find a vegan lasagna",
                "web": "https://www.allrecipes.com/",
            },
            {"web_name": "Amazon", "ques": "x", "web": "https://amazon.com"},
        ],
    )
    parsed = parse_task_file("webvoyager", wv)
    assert [t.task_id for t in parsed.tasks] == ["webvoyager/Allrecipes--0"]
    assert parsed.errors == [(2, "'id' is missing")]
    rb = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {
                "instruction": "Find the CEO",
                "start_url": "https://example.com",
                "rubric": ["Names the CEO", "Cites the about page"],
                "reference": ['goto("/about")'],
            },
            {"instruction": "x", "start_url": "https://example.com", "rubric": []},
        ],
    )
    parsed = parse_task_file("rubric", rb)
    assert parsed.tasks[0].rubric == ["Names the CEO", "Cites the about page"]
    assert parsed.tasks[0].task_id.startswith("rubric/")
    assert "'rubric' must be a non-empty list" in parsed.errors[0][1]
    with pytest.raises(WarehouseError, match="unknown task format"):
        parse_task_file("nope", rb)


def test_reimporting_a_changed_task_makes_a_new_version(wh: Warehouse, tmp_path: Path):
    row = {"web_name": "A", "id": "1", "ques": "Find X", "web": "https://a.b/"}
    p = write_jsonl(tmp_path / "wv.jsonl", [row])
    put_tasks(wh, parse_task_file("webvoyager", p).tasks)
    put_tasks(wh, parse_task_file("webvoyager", p).tasks)
    write_jsonl(p, [{**row, "ques": "Find Y"}])
    rep = put_tasks(wh, parse_task_file("webvoyager", p).tasks)
    assert rep.new_version == ["webvoyager/1"]
    rows = wh.read(Task).sort("version")
    assert rows["instruction"].to_list() == ["Find X", "Find Y"]


def test_generated_tasks_into_the_warehouse(wh: Warehouse):
    tasks = generate(300, seed=0)
    assert len({t.task_id for t in tasks}) == 300
    assert {t.split for t in tasks} == {"train", "test", "ood"}
    assert all(t.site == "travel" for t in tasks if t.split == "ood")
    assert min(t.difficulty for t in tasks) <= 3 and max(t.difficulty for t in tasks) >= 15
    assert all(t.difficulty == len(t.reference) for t in tasks)
    rep = put_tasks(wh, tasks)
    assert len(rep.new) == 300
    assert len(put_tasks(wh, tasks).unchanged) == 300
    changed = dataclasses.replace(tasks[0], instruction=tasks[0].instruction + " Quickly.")
    assert put_tasks(wh, [changed]).new_version == [tasks[0].task_id]
    assert latest_tasks(wh).height == 300
    ood = latest_tasks(wh, "split = $s", {"s": "ood"})
    assert set(ood["site"].to_list()) == {"travel"}


def test_start_urls_resolve_against_the_running_server():
    urls = {"shop": "http://127.0.0.1:5000"}
    assert (
        resolve_start_url("bundled://shop/search?q=a", urls) == "http://127.0.0.1:5000/search?q=a"
    )
    assert resolve_start_url("https://example.com/", urls) == "https://example.com/"
    with pytest.raises(KeyError, match="no running site"):
        resolve_start_url("bundled://mail/", urls)
