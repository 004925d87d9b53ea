"""A judge from a user's module (``WEBLOOP_PLUGINS``) runs like a built-in one: through the
CLI's judge flow (the stage) on an imported Online-Mind2Web run, listed by ``components``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cli.cli_runner import webloop_subprocess
from tests.warehouse.test_om2w import make_task
from warehouse import Warehouse, WarehouseConfig

PLUGIN = "tests.judging.plugin_judge"


def test_a_plugin_judge_runs_through_the_cli_and_the_judge_stage(prefect_subprocess_env, tmp_path):
    root, home = tmp_path / "om2w", tmp_path / "home"
    answers = {"t01": "Open 9-5", "t02": "I cannot find the store", "t03": ""}
    for tid, answer in answers.items():
        make_task(root, tid, n_shots=1, n_actions=1, final_result_response=answer)
    env = {**prefect_subprocess_env, "WEBLOOP_PLUGINS": PLUGIN}
    webloop_subprocess(home, "import", "om2w", str(root), "--run", "om2w", env=env)
    out = webloop_subprocess(home, "judge", "--judge", "answer_given", "--run", "om2w", env=env)
    assert "answer_given 1: judged 3: failure 2, success 1" in out.stdout, out.stdout
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        got = dict(
            wh.sql(
                "SELECT t.task_id, j.verdict || ': ' || j.rationale FROM judgments j "
                "JOIN trajectories t USING (traj_id) WHERE j.judge = 'answer_given'"
            ).iter_rows()
        )
    assert got == {
        "t01": "success: answered",
        "t02": "failure: gave up",
        "t03": "failure: no final answer",
    }
    rows = json.loads(webloop_subprocess(home, "components", "--format", "json", env=env).stdout)
    mine = next(r for r in rows if r["name"] == "answer_given")
    assert mine["kind"] == "judge" and mine["summary"].startswith("Success when the agent ended")
    without = {k: v for k, v in os.environ.items() if k != "WEBLOOP_PLUGINS"}
    r = webloop_subprocess(home, "judge", "--judge", "answer_given", ok=False, env=without)
    assert r.returncode == 2 and "answer_given" in r.stderr


def test_the_how_to_page_shows_the_plugin_module_as_it_is():
    root = Path(__file__).parents[2]
    page = (root / "docs" / "how-to" / "add-a-judge.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (root / "tests" / "judging" / "plugin_judge.py").read_text()
