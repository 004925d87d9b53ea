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
