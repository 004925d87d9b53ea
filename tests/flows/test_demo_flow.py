"""The demo (the flywheel at CPU scale), through the session's Prefect harness, sites server and
Chromium (lent to it), on a tiny one-round configuration; then ``webloop demo`` again, which must
find everything done and start nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from flows import collect as collect_module
from flows import intervene as intervene_module
from flows import score_steps as score_steps_module
from warehouse import Warehouse, WarehouseConfig

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]  # the loop on a shared machine

TINY = dict(
    bundled_tasks=60,
    expert_tasks=4,
    policy_tasks=2,
    group_size=2,
    prm_states=2,
    prm_k=2,
    interventions=1,
    epochs=2,
    eval_n=3,
    eval_max_steps=8,
    concurrency=2,
)


def refuse(*args, **kwargs):
    raise AssertionError("started a sites server or browsers although nothing was left to do")


def test_demo_runs_the_loop_and_a_second_demo_finds_it_done(
    prefect_harness, sites, chromium, tmp_path: Path, monkeypatch
):
    from flows import demo as demo_module
    from flows.cli_flywheel import register
    from flows.demo import Lent, demo_config, demo_state, run_demo, summary_lines
    from flows.flywheel import DEFAULT_RECIPE

    home = str(tmp_path / "home")
    recipe = tmp_path / "short-horizon.yaml"  # the policy's rollouts: 4 steps
    recipe.write_text(DEFAULT_RECIPE.replace("horizon: [10, 20]", "horizon: [4]"))
    cfg = demo_config(seed=3, rounds=1, recipe=str(recipe), **TINY)
    assert demo_state(cfg, home) == "new"
    out = run_demo(cfg, home, Lent(sites, chromium.browser, chromium.run))
    assert out["state"] == "new" and demo_state(cfg, home) == "done"
    (r,) = out["rounds"]
    assert r["collected"]["expert"]["ran"] == 4 and r["collected"]["policy"]["ran"] == 4
    assert r["dataset"]["counts"]["sft"] > 0 and r["steps_run"] > 0
    lines = summary_lines(out)
    text = "\n".join(lines)
    assert f"{out['untrained']['n_success']}/{out['untrained']['n']}" in text
    assert "success before (untrained ranker)" in text and "success after (1 round)" in text
    assert f"{r['dataset']['counts']['sft']} SFT rows" in text
    assert str(Path(home).resolve()) in text or home in text
    assert "webloop dashboard" in text and "prefect server start" in text
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        assert wh.sql("SELECT count(*) FROM tasks WHERE suite = 'bundled'").item() == 60
        n = {t: wh.sql(f"SELECT count(*) FROM {t}").item() for t in TABLES}
    assert n["evaluations"] == 2 and n["datasets"] == 1 and n["checkpoints"] >= 1

    # the second demo, through the CLI: it says everything is done, and starts nothing
    for module in (collect_module, intervene_module):
        monkeypatch.setattr(module, "SiteServer", refuse)
    monkeypatch.setattr(collect_module, "Engine", refuse)
    monkeypatch.setattr(score_steps_module, "_exact_scorer", refuse)
    monkeypatch.setattr(demo_module, "lend", refuse)
    monkeypatch.setattr(demo_module, "demo_config", lambda seed, rounds: cfg)
    monkeypatch.setenv("WEBLOOP_HOME", home)
    monkeypatch.delenv("WEBLOOP_WAREHOUSE", raising=False)
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """(a group, so that ``demo`` is a subcommand)"""

    res = CliRunner().invoke(app, ["demo", "--seed", "3", "--rounds", "1"])
    assert res.exit_code == 0, res.output
    assert "an earlier demo finished" in res.output
    assert "found everything done" in res.output
    assert "success after (1 round)" in res.output
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        assert {t: wh.sql(f"SELECT count(*) FROM {t}").item() for t in TABLES} == n


TABLES = (
    "trajectories",
    "steps",
    "judgments",
    "datasets",
    "training_runs",
    "checkpoints",
    "evaluations",
    "interventions",
)


def test_demo_config_is_the_cpu_scale_flywheel():
    from flows.demo import demo_config
    from flows.flywheel import FlywheelError

    cfg = demo_config(seed=1, rounds=2)
    cfg.check()
    assert (cfg.rounds, cfg.seed) == (2, 1)
    assert cfg.flywheel_id != demo_config(seed=2, rounds=2).flywheel_id
    assert cfg.flywheel_id == demo_config(seed=1, rounds=2, concurrency=1).flywheel_id
    assert cfg.horizon(1) < cfg.horizon(2) == cfg.horizon(5)  # the recipe's schedule
    with pytest.raises(FlywheelError, match="--rounds"):
        demo_config(rounds=0).check()
