"""``webloop components``: every registered judge, PRM scorer and estimator describes itself."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.cli_runner import webloop


def test_components_lists_each_estimator_and_scorer_with_what_it_needs(tmp_path: Path):
    rows = json.loads(webloop(tmp_path, "components", "--format", "json").stdout)
    by = {(r["kind"], r["name"]): r for r in rows}
    assert {n for k, n in by if k == "advantage estimator"} == {
        "awr", "grpo", "step_awr", "step_best", "step_grpo", "turn"
    }  # fmt: skip
    assert {n for k, n in by if k == "PRM scorer"} == {"exact", "reference", "vlm"}
    assert by["advantage estimator", "step_best"]["needs"] == "level step, objective awr"
    assert by["advantage estimator", "turn"]["needs"].endswith("engine record_progress")
    assert by["advantage estimator", "awr"]["options"] == "gamma=1.0, beta=1.0, w_max=20.0"
    assert by["PRM scorer", "exact"]["needs"] == "bundled, replay, expert candidate"
    assert by["PRM scorer", "vlm"]["needs"] == "endpoint"
    assert len(by["PRM scorer", "vlm"]["prompts"]) == 16
    assert by["PRM scorer", "exact"]["prompts"] == ""
    assert {n for k, n in by if k == "judge"} == {
        "ensemble", "outcome_vlm", "programmatic", "rubric_vlm"
    }  # fmt: skip
    protocols = {n.split(" ")[0]: r for (k, n), r in by.items() if k == "evaluation protocol"}
    assert set(protocols) == {"checkers", "outcome", "webvoyager", "webjudge"}
    assert protocols["webjudge"]["options"] == "rubric_vlm, selection='model', k=4, max_tokens=512"
    assert "Online-Mind2Web" in protocols["webjudge"]["summary"]
    assert by["judge", "rubric_vlm"]["prompts"] == protocols["webjudge"]["prompts"] != ""
    assert (
        protocols["outcome"]["needs"] == "endpoint" and protocols["checkers"]["needs"] == "checkers"
    )
    assert by["judge", "rubric_vlm"]["options"] == (
        "base_url, model, k=4, selection='model', max_tokens=512, timeout_s=120.0, retries=2, "
        "backoff_s=0.5"
    )
    assert by["judge", "programmatic"]["options"] == ""
    assert by["judge", "programmatic"]["needs"] == "checkers"
    assert all(r["summary"] for r in rows)
    table = webloop(tmp_path, "components").stdout
    assert "step_best" in table and "reference" in table


def test_components_name_prints_its_options_with_defaults_and_help(tmp_path: Path):
    rows = json.loads(webloop(tmp_path, "components", "rubric_vlm", "--format", "json").stdout)
    by = {r["option"]: r for r in rows}
    assert by["k"]["default"] == "4" and by["k"]["help"].startswith("key screenshots at most")
    assert by["base_url"]["default"] == "(required)"
    awr = json.loads(webloop(tmp_path, "components", "awr", "--format", "json").stdout)
    assert [(r["option"], r["default"]) for r in awr] == [
        ("gamma", "1.0"), ("beta", "1.0"), ("w_max", "20.0")
    ]  # fmt: skip
    r = webloop(tmp_path, "components", "nope", ok=False)
    assert r.returncode == 2 and "no judge or advantage estimator 'nope'" in r.stderr


def test_every_built_in_option_says_what_it_does():
    from cli.components import option_rows
    from judging.base import SPECS as JUDGES
    from training.advantages import SPECS as ESTIMATORS

    for name in (*JUDGES, *ESTIMATORS):
        missing = [r["option"] for r in option_rows(name)[1] if not r["help"]]
        assert not missing, f"{name}: no :param help for {missing}"
