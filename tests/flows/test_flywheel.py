"""The flywheel flow and the demo, end to end on a tiny configuration, through the session's
Prefect harness, sites server and Chromium: one flywheel started as ``webloop flywheel`` in its
own process, killed (SIGKILL of its process group) in round 2, and continued in-process by the
demo (``run_demo``, which says it continues an interrupted run) to the end. The rows each round
leaves are checked on that resumed run, against what an uninterrupted run holds by construction
(every named run's trajectory ids follow from its deterministic task selection); then a second
``webloop demo`` finds everything done, starts nothing and adds nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stages.flywheel import DEFAULT_RECIPE
from warehouse import Warehouse, WarehouseConfig

# every stage of the loop (twice, and once more killed), on a shared 2-core machine
pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]

ROOT = Path(__file__).parents[2]
TINY: dict[str, Any] = dict(
    rounds=2,
    bundled_tasks=60,
    # noise 0: the policy's failures feed the interventions; an expert's skipped steps only wait
    expert={"n_tasks": 4, "noise": 0.0},
    rollout={"n_tasks": 3, "samples": 2},
    prm_states=1,
    prm_k=2,
    interventions=1,
    epochs=2,
    later_epochs=1,
    eval={"n_tasks": 3, "max_steps": 8},
    concurrency=2,
)
# the default recipe with a short horizon schedule: the policy's rollouts get 5, then 8 steps
TINY_RECIPE = DEFAULT_RECIPE.replace("horizon: [10, 20]", "horizon: [5, 8]")


@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory) -> str:
    assert TINY_RECIPE != DEFAULT_RECIPE
    path = tmp_path_factory.mktemp("recipe") / "flywheel-tiny.yaml"
    path.write_text(TINY_RECIPE)
    return str(path)


def tiny_config(recipe: str) -> Any:
    from stages.config import config_from_mapping
    from stages.flywheel import FlywheelConfig

    return config_from_mapping(FlywheelConfig, {**TINY, "recipe": recipe})


def refuse(*args, **kwargs):
    raise AssertionError("started a sites server or browsers although nothing was left to do")


def snapshot(home: str, fid: str) -> dict[str, Any]:
    """What the flywheel stored: ids of its named runs' trajectories, and counts of the rest."""
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:

        def one(q: str, *p: Any) -> Any:
            return wh.sql(q, list(p)).item()

        named = wh.sql(
            "SELECT run_id, traj_id, policy FROM trajectories WHERE starts_with(run_id, ?) "
            "ORDER BY traj_id",
            [fid],
        )
        return {
            "named": named.rows(),
            "trajectories": one("SELECT count(*) FROM trajectories"),
            "distinct_trajectories": one("SELECT count(DISTINCT traj_id) FROM trajectories"),
            "steps": one("SELECT count(*) FROM steps"),
            "distinct_steps": one("SELECT count(DISTINCT (traj_id, step_idx)) FROM steps"),
            "judgments": one("SELECT count(*) FROM judgments"),
            "distinct_judgments": one(
                "SELECT count(DISTINCT (traj_id, judge, judge_version)) FROM judgments"
            ),
            "datasets": one("SELECT count(*) FROM datasets"),
            "training_runs": one("SELECT count(*) FROM training_runs"),
            "checkpoints": one("SELECT count(*) FROM checkpoints"),
            "metrics": one("SELECT count(*) FROM metrics"),
            "distinct_metrics": one(
                "SELECT count(DISTINCT (training_run_id, step, name)) FROM metrics"
            ),
            "evaluations": one("SELECT count(*) FROM evaluations"),
            "eval_trajectories": one(
                "SELECT count(*) FROM trajectories WHERE run_id IN (SELECT run_id FROM evaluations)"
            ),
            "interventions": one("SELECT count(*) FROM interventions"),
            "step_scores": one("SELECT count(*) FROM step_scores"),
        }


@pytest.fixture(scope="module")
def resumed(prefect_harness, sites, chromium, tiny_recipe, tmp_path_factory) -> dict[str, Any]:
    """The tiny flywheel run as a process of its own, SIGKILLed once round 2's collection has
    written, then continued in-process by the demo (on the session's sites and Chromium)."""
    from flows.demo import demo_state, run_demo
    from stages.flywheel import Lent, flywheel_status, run_name

    cfg = tiny_config(tiny_recipe)
    home = str(tmp_path_factory.mktemp("flywheel") / "home")
    from stages.config import dump_config

    settings = tmp_path_factory.mktemp("settings") / "flywheel.yaml"
    settings.write_text(dump_config(cfg))  # the same config, as a user's --config file
    args = ["--config", str(settings)]
    env = {**os.environ, "PREFECT_API_URL": prefect_harness, "WEBLOOP_HOME": home}
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("WEBLOOP_WAREHOUSE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.flywheel", "flywheel", *args],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # its own process group: the sites server and Chromium too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    round2 = run_name(cfg, 2, "policy")
    killed = False
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            if _round2_started(home, round2):
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.3)
    finally:
        if proc.poll() is None and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert killed, f"the flywheel never reached round 2: {proc.stderr.read().decode()[-2000:]}"
    killed_status = flywheel_status(cfg, home)
    killed_state = demo_state(cfg, home)
    before = snapshot(home, cfg.flywheel_id)
    out = run_demo(cfg, home, Lent(sites, chromium.browser, chromium.run))
    return {
        "cfg": cfg,
        "home": home,
        "out": out,
        "killed_status": killed_status,
        "killed_state": killed_state,
        "before": before,
        "stored": snapshot(home, cfg.flywheel_id),
    }


def test_killed_in_round_two_then_resumed_redoes_nothing_of_round_one(resumed):
    from flows.demo import demo_state, summary_lines
    from stages.flywheel import flywheel_status

    before, out = resumed["before"], resumed["out"]
    assert resumed["killed_status"] == "running"  # killed: never marked completed
    assert resumed["killed_state"] == out.state == "interrupted"
    assert demo_state(resumed["cfg"], resumed["home"]) == "done"
    assert before["datasets"] == 1 and before["evaluations"] == 2  # round 2 had not finished
    assert [r.round for r in out.rounds] == [1, 2]
    assert out.rounds[0].dataset["built"] is False  # round 1 was not redone
    assert all(c.ran == 0 for c in out.rounds[0].collected.values())
    assert flywheel_status(resumed["cfg"], resumed["home"]) == "completed"
    after = resumed["stored"]
    for k in ("trajectories", "steps", "judgments", "metrics"):  # nothing twice
        assert after[k] == after[f"distinct_{k}"], k
    # what the killed process stored is still there
    assert set(before["named"]) <= set(after["named"])
    # the demo's summary says what happened
    text = "\n".join(summary_lines(out))
    assert text.startswith("an earlier demo had stopped part-way: it continued where it stopped")
    u, f = out.untrained, out.final
    assert f"success before (untrained ranker): {u['n_success']}/{u['n']}" in text
    assert f"success after (2 rounds): {f['n_success']}/{f['n']}" in text
    assert f"(paired on {u['n']} tasks" in text  # the same held-out tasks before and after
    sft = out.rounds[1].dataset["counts"]["sft"]
    assert f"{sft} SFT rows" in text and resumed["home"] in text
    assert "webloop dashboard" in text and "prefect server start" in text
    # and what each round changed: its corrections and its paired change against the one before
    r2 = out.rounds[1]
    assert re.search(r"round 2: .*; corrections: ", text)
    d = r2.delta
    assert (
        f"{100 * d['diff']:+.1f} points against round 1 (paired, {d['a_only']} lost / "
        f"{d['b_only']} gained)"
    ) in text


def test_named_runs_hold_what_an_uninterrupted_run_holds(resumed):
    """Every collect run of the flywheel holds exactly its selected tasks x samples (the
    trajectory ids a run that was never killed has), the intervention replays one per settled
    intervention, and every evaluation its episodes."""
    from stages.collect import select_tasks
    from stages.flywheel import expert_config, policy_config, run_name
    from warehouse.ids import traj_id_for

    cfg, home, out = resumed["cfg"], resumed["home"], resumed["out"]
    named = {(run, traj): policy for run, traj, policy in resumed["stored"]["named"]}
    ckpts = [cfg_round.trained.checkpoint for cfg_round in out.rounds]
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        collects = [expert_config(cfg), policy_config(cfg, 1, "x"), policy_config(cfg, 2, "x")]
        for ccfg in collects:
            expected = {
                traj_id_for(ccfg.run_name, t.task_id, k)
                for t in select_tasks(wh, ccfg)
                for k in range(ccfg.samples)
            }
            stored = {traj for run, traj in named if run == ccfg.run_name}
            assert stored == expected, ccfg.run_name
        replays = wh.sql(
            "SELECT run_id, replay_traj_id FROM interventions WHERE replay_traj_id IS NOT NULL"
        ).rows()
        for r in (1, 2):
            stored = {traj for run, traj in named if run == run_name(cfg, r, "intervene")}
            assert stored == {t for run, t in replays if run == run_name(cfg, r, "intervene")}
            assert len(stored) == cfg.interventions
    assert len(ckpts) == 2 and all(ckpts)
    counts = {k: resumed["stored"][k] for k in ("datasets", "training_runs", "evaluations")}
    assert counts == {"datasets": 2, "training_runs": 2, "evaluations": 3}
    assert resumed["stored"]["eval_trajectories"] == 3 * cfg.eval.n_tasks


def test_each_round_leaves_its_rows(resumed):
    from stages.flywheel import flywheel_status, round_recipe, run_name

    cfg, home, out = resumed["cfg"], resumed["home"], resumed["out"]
    fid = cfg.flywheel_id
    assert [r.round for r in out.rounds] == [1, 2]
    assert flywheel_status(cfg, home) == "completed"
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        by_run = dict(
            wh.sql(
                "SELECT run_id, count(*) FROM trajectories WHERE starts_with(run_id, ?) "
                "GROUP BY run_id",
                [fid],
            ).rows()
        )
        # round 1: the expert (1 sample per task) and the untrained ranker (G per task)
        assert cfg.horizon(1) == 5 and cfg.horizon(2) == cfg.horizon(3) == 8
        assert by_run[run_name(cfg, 1, "expert")] == 4
        assert by_run[run_name(cfg, 1, "policy")] == 3 * 2
        # round 2: the round-1 checkpoint, sampled, G per task
        assert by_run[run_name(cfg, 2, "policy")] == 3 * 2
        longest = wh.sql(
            "SELECT max(n_steps) FROM trajectories WHERE run_id = ?", [run_name(cfg, 1, "policy")]
        ).item()
        assert longest <= 5  # the recipe's horizon for round 1
        policies = dict(
            wh.sql(
                "SELECT run_id, any_value(policy) FROM trajectories WHERE run_id IN (?, ?, ?) "
                "GROUP BY run_id",
                [run_name(cfg, r, w) for r, w in ((1, "expert"), (1, "policy"), (2, "policy"))],
            ).rows()
        )
        assert policies[run_name(cfg, 1, "expert")] == "expert"
        assert policies[run_name(cfg, 2, "policy")].startswith("ranker")
        # every trajectory of the three collect runs has one programmatic judgment
        judged = wh.sql(
            "SELECT count(DISTINCT j.traj_id) FROM judgments j JOIN trajectories t "
            "USING (traj_id) WHERE t.run_id IN (?, ?, ?) AND j.judge = 'programmatic'",
            [run_name(cfg, r, w) for r, w in ((1, "expert"), (1, "policy"), (2, "policy"))],
        ).item()
        assert judged == 16
        assert wh.sql("SELECT count(*) FROM step_scores WHERE scorer = 'exact'").item() > 0
        # one dataset per round; round 2's recipe reads round 1's runs too
        ds = [r.dataset for r in out.rounds]
        assert wh.sql("SELECT count(*) FROM datasets").item() == 2
        assert ds[0]["dataset_id"] != ds[1]["dataset_id"]
        assert run_name(cfg, 1, "expert") in round_recipe(cfg, 2).sources.runs
        members = set(
            wh.sql(
                "SELECT DISTINCT traj_id FROM dataset_members WHERE dataset_id = ?",
                [ds[1]["dataset_id"]],
            )["traj_id"]
        )
        round1 = set(
            wh.sql(
                "SELECT DISTINCT traj_id FROM dataset_members WHERE dataset_id = ?",
                [ds[0]["dataset_id"]],
            )["traj_id"]
        )
        assert round1 and round1 <= members  # successes so far: round 1's stay in
        # round 2's checkpoint: trained on round 2's data, starting from round 1's checkpoint
        c1, c2 = (r.trained for r in out.rounds)
        lin = wh.sql(
            "SELECT c.checkpoint_id, r.dataset_id, r.base_model FROM checkpoints c "
            "JOIN training_runs r USING (training_run_id) WHERE c.checkpoint_id = ?",
            [c2.checkpoint_id],
        ).row(0, named=True)
        assert lin["dataset_id"] == ds[1]["dataset_id"]
        assert lin["base_model"] == c1.checkpoint
        # evaluations: the untrained ranker, then each round's checkpoint, on held-out tasks
        evals = wh.sql("SELECT checkpoint_id, split, n FROM evaluations ORDER BY created_at")
        assert evals.height == 3
        assert set(evals["split"]) == {"test"}
        trained = {c1.checkpoint_id, c2.checkpoint_id}
        assert set(evals["checkpoint_id"].drop_nulls()) == trained
    for r in out.rounds:
        md = r.markdown
        assert f"round {r.round}/2" in md and "success after" in md and "[" in md
        # each round is evaluated on the same seeded held-out tasks: compared paired
        d = r.delta
        assert d["method"] == "paired" and d["n_pairs"] == r.after["n"], d
        assert f"paired on {d['n_pairs']} tasks" in md
        assert 0.0 <= r.after["ci_low"] <= r.after["rate"] <= r.after["ci_high"] <= 1.0
    assert out.rounds[1].before["evaluation_id"] == out.rounds[0].after["evaluation_id"]


def test_a_second_demo_finds_everything_done_and_starts_nothing(resumed, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from cli.flywheel import register
    from flows import demo as demo_module
    from stages import collect as collect_module
    from stages import intervene as intervene_module
    from stages import score_steps as score_steps_module

    cfg, home = resumed["cfg"], resumed["home"]
    for module in (collect_module, intervene_module):
        monkeypatch.setattr(module, "SiteServer", refuse)
    monkeypatch.setattr(collect_module, "Engine", refuse)
    monkeypatch.setattr(score_steps_module, "_replay_scorer", refuse)
    monkeypatch.setattr(demo_module, "lend", refuse)
    monkeypatch.setattr(demo_module, "demo_config", lambda seed, rounds: cfg)
    monkeypatch.setenv("WEBLOOP_HOME", home)
    monkeypatch.delenv("WEBLOOP_WAREHOUSE", raising=False)
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """(a group, so that ``demo`` is a subcommand)"""

    res = CliRunner().invoke(app, ["demo", "--rounds", "2"])
    assert res.exit_code == 0, res.output
    assert "an earlier demo finished" in res.output
    assert "found everything done" in res.output
    assert "success after (2 rounds)" in res.output
    assert snapshot(home, cfg.flywheel_id) == resumed["stored"]


def _round2_started(home: str, run_id: str) -> bool:
    """Whether round 2's collect run has written (polled while the flywheel runs)."""
    if not (Path(home) / "lake").exists():
        return False
    try:
        with Warehouse.open(
            WarehouseConfig.from_env(home=home, warehouse=""), read_only=True
        ) as wh:
            return bool(
                wh.sql("SELECT count(*) FROM trajectories WHERE run_id = ?", [run_id]).item()
            )
    except Exception:  # the catalog is being created or written: poll again
        return False
