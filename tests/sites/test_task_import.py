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
    parsed = parse_task_file("om2w", p)
    assert parsed.tasks == [] and "not valid JSON" in parsed.errors[0][1]


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
            {"web_name": "Amazon", "id": "Amazon--1", "web": "https://amazon.com"},
        ],
    )
    parsed = parse_task_file("webvoyager", wv)
    # a missing id is derived from the file name and the line
    assert [t.task_id for t in parsed.tasks] == ["webvoyager/Allrecipes--0", "webvoyager/wv-2"]
    assert parsed.errors == [
        (
            3,
            "'ques' is missing or empty (also looked for question, task, "
            "instruction, confirmed_task)",
        )
    ]
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
    assert {t.split for t in tasks} == {"train", "val", "test", "ood"}
    inside = [t for t in tasks if t.split != "ood"]  # 70 / 10 / 20% of the training sites
    share = {s: sum(t.split == s for t in inside) / len(inside) for s in ("train", "val", "test")}
    assert abs(share["train"] - 0.7) < 0.08 and abs(share["val"] - 0.1) < 0.05, share
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


# -- real files vary: the shapes published benchmark files (and their forks) come in ---------


def test_om2w_published_shape_as_a_json_array_with_a_bom(tmp_path: Path):
    # Online_Mind2Web.json: a pretty-printed array; some copies carry a UTF-8 byte-order mark
    rows = [
        {
            "task_id": "fb7b4f784cfde003e2548fdf4e8d6b4f",
            "confirmed_task": "Open the page with the rules of a lottery game.",
            "website": "https://www.example-lottery.com/",
            "reference_length": 5,
            "level": "easy",
        },
        {
            "task_id": "0a1b",
            "confirmed_task": "Find the store hours.",
            "website": "https://shop.example.org/",
            "reference_length": 11,
            "level": "medium",
        },
    ]
    p = tmp_path / "Online_Mind2Web.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows, indent=4).encode())
    parsed = parse_task_file("om2w", p)
    assert parsed.errors == [] and parsed.unit == "entry"
    assert [(t.task_id, t.site, t.difficulty, t.meta) for t in parsed.tasks] == [
        ("fb7b4f784cfde003e2548fdf4e8d6b4f", "www.example-lottery.com", 5, {"level": "easy"}),
        ("0a1b", "shop.example.org", 11, {"level": "medium"}),
    ]


def test_om2w_fork_keys_are_derived(tmp_path: Path):
    rows = [
        # id / task / start_url (forks); "7" is a number
        {
            "id": "a1",
            "task": "Buy socks",
            "start_url": "https://a.example/",
            "reference_length": "7",
        },
        # instruction + a bare host for website (derive https://host)
        {"annotation_id": "a2", "instruction": "Sell socks", "website": "www.booking.com"},
        # no id at all: derived from the file name and the line number
        {"confirmed_task": "Rent a car", "web": "https://cars.example/x"},
        # a Mind2Web (offline) site *name* is not a start URL: reported, not guessed
        {"task_id": "a4", "confirmed_task": "Order pickup", "website": "exploretock"},
        {"task_id": "a5", "website": "https://x.example/"},
    ]
    parsed = parse_task_file("om2w", write_jsonl(tmp_path / "fork.jsonl", rows))
    got = [(t.task_id, t.instruction, t.start_url, t.site, t.difficulty) for t in parsed.tasks]
    assert got == [
        ("a1", "Buy socks", "https://a.example/", "a.example", 7),
        ("a2", "Sell socks", "https://www.booking.com/", "www.booking.com", None),
        ("fork-3", "Rent a car", "https://cars.example/x", "cars.example", None),
    ]
    errors = dict(parsed.errors)
    assert set(errors) == {4, 5}
    assert "'website' is not an http(s) URL or a host name: 'exploretock'" in errors[4]
    assert errors[5].startswith("'confirmed_task' is missing or empty (also looked for task")


def test_webvoyager_published_jsonl_and_variants(tmp_path: Path):
    lines = [
        '{"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Find a vegan lasagna", '
        '"web": "https://www.allrecipes.com/"}',
        "",  # blank lines are skipped
        # no web_name: the site comes from the host
        '{"id": "GitHub--3", "ques": "Find the most starred repo", "web": "https://github.com/"}',
        # an integer id and 'question' instead of 'ques'
        '{"web_name": "ESPN", "id": 7, "question": "NBA scores", "web": "https://www.espn.com/"}',
        # a trailing comma after the object (a JSON array pasted as lines)
        '{"web_name": "BBC", "id": "BBC--1", "ques": "Top story", "web": "https://bbc.com/"},',
        '{"web_name": "Broken", "id": "B--1", "ques": "x", "web": "https://b.com/",',
        '{"web_name": "NoUrl", "id": "N--1", "ques": "x"}',
    ]
    p = tmp_path / "WebVoyager_data.jsonl"
    p.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    parsed = parse_task_file("webvoyager", p)
    assert [(t.task_id, t.site) for t in parsed.tasks] == [
        ("webvoyager/Allrecipes--0", "Allrecipes"),
        ("webvoyager/GitHub--3", "github.com"),
        ("webvoyager/7", "ESPN"),
        ("webvoyager/BBC--1", "BBC"),
    ]
    errors = dict(parsed.errors)
    assert set(errors) == {6, 7} and parsed.unit == "line"
    assert errors[6].startswith("not valid JSON")
    assert errors[7].startswith("'web' is missing or empty")


def test_a_json_array_with_a_trailing_comma_or_a_broken_entry_keeps_the_good_entries(
    tmp_path: Path,
):
    good = {"task_id": "a", "confirmed_task": "t", "website": "https://a.b/"}
    other = {"task_id": "b", "confirmed_task": "u", "website": "https://a.b/"}
    p = tmp_path / "t.json"
    p.write_text("[\n" + json.dumps(good) + ",\n" + json.dumps(other) + ",\n]\n")
    parsed = parse_task_file("om2w", p)
    assert [t.task_id for t in parsed.tasks] == ["a", "b"] and parsed.errors == []
    p.write_text("[\n" + json.dumps(good) + ",\n" + '{"task_id": "c", oops}' + ",\n]")
    parsed = parse_task_file("om2w", p)
    assert [t.task_id for t in parsed.tasks] == ["a"]
    assert parsed.errors[0][0] == 2 and "line 3 column" in parsed.errors[0][1]
    p.write_text(json.dumps({"tasks": [good, other]}))  # a wrapper object
    assert [t.task_id for t in parse_task_file("om2w", p).tasks] == ["a", "b"]
    p.write_text(json.dumps(good, indent=2))  # one pretty-printed object
    assert [t.task_id for t in parse_task_file("om2w", p).tasks] == ["a"]


def test_unreadable_task_files_are_one_error(tmp_path: Path):
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"task": "caf\xe9"}\n')
    with pytest.raises(WarehouseError, match="not UTF-8"):
        parse_task_file("om2w", p)
    with pytest.raises(WarehouseError, match="cannot read"):
        parse_task_file("om2w", tmp_path / "missing.json")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert parse_task_file("om2w", empty).errors == [(1, "the file has no tasks")]
