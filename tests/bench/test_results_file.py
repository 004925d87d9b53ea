"""A benchmark's results file holds every line it printed, its figures, its arguments and the
code version; a --quick run writes one only when asked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.results import Results


def test_the_results_file_records_what_the_bench_printed(tmp_path: Path, capsys):
    rec = Results("demo", argparse.Namespace(quick=False, home=tmp_path, n=3))
    rec.say("sft curated: 12/20")
    rec.figures["evaluations"] = {"sft/test": {"n": 20, "n_success": 12}}
    assert rec.write(None, quick=True) is None  # the suite's quick runs leave no file
    path = rec.write(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["lines"] == ["sft curated: 12/20"] and data["args"]["n"] == 3
    assert data["figures"]["evaluations"]["sft/test"]["n_success"] == 12
    assert (
        data["bench"] == "demo" and data["code_version"] and data["args"]["home"] == str(tmp_path)
    )
    assert "sft curated: 12/20" in capsys.readouterr().out
    default = rec.path(None, quick=False)
    assert default.parent.name == "results" and default.name.startswith("demo-")


def test_capture_records_every_printed_line_with_load_and_versions(tmp_path: Path):
    from bench.results import capture

    args = argparse.Namespace(quick=False, results=tmp_path / "w.json")
    with capture("warehouse", args):
        print("ingest: 21,094 steps/s")
        print("ratio DuckLake / plain DuckDB (wall): 0.69", end="")
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["lines"] == ["ingest: 21,094 steps/s", "ratio DuckLake / plain DuckDB (wall): 0.69"]
    assert len(data["load"]["start"]) == 3 and data["versions"]["duckdb"]
    with capture("warehouse", argparse.Namespace(quick=True, results=None)):
        print("quick")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json"]  # a quick run writes nothing


def test_a_bench_that_fails_writes_no_results_file(tmp_path: Path):
    import pytest

    from bench.results import capture

    with (
        pytest.raises(RuntimeError),
        capture("x", argparse.Namespace(quick=False, results=tmp_path / "x.json")),
    ):
        print("half a figure")
        raise RuntimeError("browser crashed")
    assert not (tmp_path / "x.json").exists()


def test_the_benchmark_page_renders_every_results_file_newest_first(tmp_path: Path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render", Path(__file__).parents[2] / "bench" / "render.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    for stamp, figure in (("20261201T100000Z", "old: 1.0"), ("20261203T100000Z", "new: 2.0")):
        rec = Results("warehouse", argparse.Namespace(quick=False, steps=10))
        rec.say(figure)
        rec.started = rec.started.replace(day=int(stamp[6:8]))
        rec.write(tmp_path / f"warehouse-abc-{stamp}.json")
    (tmp_path / "broken.json").write_text("{not json")
    page = render.render_page(tmp_path)
    assert "skipping" in capsys.readouterr().err  # the broken file is named, the rest renders
    section = page.split("## `bench/warehouse.py`")[1].split("## ")[0]
    assert "new: 2.0" in section and "old: 1.0" not in section.split("| run (UTC)")[0]
    assert section.index("20261203T100000Z") < section.rindex("20261201T100000Z")  # newest first
    assert "Settings: quick=False, steps=10." in section
    assert "No results file yet: run `python bench/serving.py`." in page


def test_the_page_gives_the_spread_of_runs_of_the_same_settings(tmp_path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render", Path(__file__).parents[2] / "bench" / "render.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    runs = (("01", 3, 12, 0.15, 0.02), ("02", 3, 9, 0.05, 0.5), ("03", 4, 20, 0.0, 1.0))
    for day, n_arg, solved, diff, p in runs:  # the 3rd run: other settings, left out
        args = argparse.Namespace(quick=False, n=n_arg, home=tmp_path / day, seed=int(day))
        rec = Results("ood", args)
        rec.started = rec.started.replace(day=int(day))
        rec.figures["evaluations"] = {"k/ood": {"n": 40, "n_success": solved}}
        rec.figures["differences"] = {"k - 0": {"diff": diff, "mcnemar_p": p}}
        rec.write(tmp_path / f"ood-abc-202612{day}T100000Z.json")
    section = render.render_page(tmp_path).split("## `bench/ood.py`")[1].split("\n## ")[0]
    assert "Settings: quick=False, n=4, seed=3." in section  # the newest run, alone in its settings
    assert "one run of these settings so far" in section and "| k/ood |" not in section
    (tmp_path / "ood-abc-20261203T100000Z.json").unlink()
    section = render.render_page(tmp_path).split("## `bench/ood.py`")[1].split("\n## ")[0]
    assert "Run-to-run spread: the 2 runs of these settings." in section  # seeds, homes differ
    assert "12-02 seed 2 | `" in section and "12-01 seed 1 | range |" in section
    assert "| k/ood | 9/40 (22.5%) | 12/40 (30.0%) | 22.5% – 30.0% (7.5 points) |" in section
    assert (
        "| k - 0 (paired) | +5.0 points, McNemar p 0.5 | +15.0 points, McNemar p 0.02 "
        "| +5.0 – +15.0 points |"
    ) in section


def test_the_code_version_is_the_one_the_run_started_on(tmp_path: Path, monkeypatch):
    import stages.runs

    monkeypatch.setattr(stages.runs, "code_version", lambda: "aaaaaaa")
    rec = Results("ood", argparse.Namespace(quick=False))
    monkeypatch.setattr(stages.runs, "code_version", lambda: "bbbbbbb")  # committed meanwhile
    path = rec.write(tmp_path / "r.json")
    assert json.loads(path.read_text())["code_version"] == "aaaaaaa"
    assert rec.path(None, quick=False).name.startswith("ood-aaaaaaa-")


def test_a_spread_row_no_run_has_a_figure_for_is_a_dash():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render", Path(__file__).parents[2] / "bench" / "render.py"
    )
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    newest = {"evaluations": {"k/ood": {"n": 0, "n_success": 0}}, "differences": {"k": {}}}
    recs = [
        {"started": "2026-12-02T00:00:00", "args": {"n": 1}, "figures": newest},
        {"started": "2026-12-01T00:00:00", "args": {"n": 1}, "figures": {}},
    ]
    rows = render.spread(recs)
    assert "| k/ood | – | – | – |" in rows and "| k (paired) | – | – | – |" in rows
