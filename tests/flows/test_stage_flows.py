"""Every stage flow under the session's Prefect harness, on one small warehouse that the stages
fill: collect → judge → score_steps → intervene → curate → train_sft → evaluate → train_rl (and
one without a learning signal) → evaluate_newest → train_rl with step_grpo → maintain_warehouse.
Each stage a test needs is a module fixture (run once, by whichever test asks first), so any test
runs alone as well as in file order. Each leaves the expected rows; the stages that
record a ``runs`` row are checked for it, and the Prefect flow-run id where the stage records it;
the curate, train and evaluate artifacts are read back through the Prefect client.

The flows run as users run them: each stage that needs the sites or a browser starts its own
(a sites server process, Chromium), only while it has work."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from flows.collect import collect_flow
from flows.curate import curate_flow
from flows.evaluate import evaluate_flow, evaluate_newest_flow
from flows.intervene import intervene_flow
from flows.judge import judge_flow
from flows.maintain import maintain_warehouse
from flows.score_steps import score_steps_flow
from flows.train import train_rl_flow, train_sft_flow
from sites.tasks import generate
from stages.collect import CollectConfig
from stages.config import config_from_mapping
from stages.curate import CurateConfig
from stages.evaluate import EvalConfig
from stages.intervene import InterveneConfig
from stages.judge import JudgeConfig
from stages.score_steps import ScoreStepsConfig
from stages.train import RLConfig, SFTConfig
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.prefect]
TEMPLATES = ["wiki_fact", "shop_add_to_cart", "mail_archive", "shop_product_fact"]
RECIPE = """\
name: stage-set
sources: {{splits: [train], runs: [{run}]}}
filters:
  - verdict: {{judges: [programmatic], verdict: success, min_agreement: 1.0}}
  - drop_invalid_steps: {{noop: false}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
gates: {{success_rate: [0.0, 1.0]}}
"""
SHORT = dict(max_steps=8, action_timeout_s=1.5, concurrency=2)


@pytest.fixture(scope="module")
def home(prefect_harness, tmp_path_factory) -> str:
    """A warehouse with the short bundled tasks (train, test) and nothing else yet."""
    h = tmp_path_factory.mktemp("stages") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        put_tasks(wh, generate(24, 0, templates=TEMPLATES))
    return str(h)


def run(flow: Any, *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """Run ``flow``; (its result, its Prefect flow-run id)."""
    state = flow(*args, **kwargs, return_state=True)
    assert state.is_completed(), state
    return state.result(), str(state.state_details.flow_run_id)


def sql(home: str, query: str, params: Any = None) -> list[tuple]:
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        return wh.sql(query, params).rows()


def run_row(home: str, run_id: str) -> dict[str, Any]:
    rows = sql(home, "SELECT kind, status, config FROM runs WHERE run_id = ?", [run_id])
    assert len(rows) == 1, f"run {run_id} not in runs"
    kind, status, config = rows[0]
    return {"kind": kind, "status": status, "config": _json(config)}


def _json(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value or {})


async def _artifacts(key: str) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


def artifact(key: str, flow_run_id: str) -> str:
    """The markdown of artifact ``key`` that flow run ``flow_run_id`` created."""
    mine = [a for a in asyncio.run(_artifacts(key)) if str(a.flow_run_id) == flow_run_id]
    assert len(mine) == 1, f"{len(mine)} artifacts {key!r} of flow run {flow_run_id}"
    assert mine[0].type == "markdown"
    return mine[0].data


@pytest.fixture(scope="module")
def collected(home: str) -> tuple[Any, str]:
    cfg = CollectConfig(
        split="train", n_tasks=3, samples=2, noise=0.4, prompt_mode="a11y", seed=1, **SHORT
    )
    return run(collect_flow, cfg, home)


@pytest.fixture(scope="module")
def judged(home: str, collected: tuple) -> tuple[Any, str]:
    return run(judge_flow, JudgeConfig(judge="programmatic", run=collected[0].run_id), home)


@pytest.fixture(scope="module")
def dataset(home: str, collected: tuple, judged: tuple, tmp_path_factory) -> tuple[Any, str]:
    recipe = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    recipe.write_text(RECIPE.format(run=collected[0].run_id))
    out_dir = str(tmp_path_factory.mktemp("datasets"))
    return run(curate_flow, CurateConfig(recipe=str(recipe), out=out_dir), home)


@pytest.fixture(scope="module")
def sft(home: str, dataset: tuple) -> tuple[Any, str]:
    cfg = SFTConfig(dataset=dataset[0].dataset_id, epochs=2, batch_size=4, lr=3e-3)
    return run(train_sft_flow, cfg, home)


@pytest.fixture(scope="module")
def eval_sft(home: str, sft: tuple) -> tuple[Any, str]:
    rollout = {"split": "test", "n_tasks": 2, **SHORT}
    cfg = config_from_mapping(EvalConfig, {"checkpoint": sft[0].checkpoint_id, "rollout": rollout})
    return run(evaluate_flow, cfg, home)


_ROLLOUT = {"samples", "n_tasks", "seed", "temperature", "max_steps"}


def _rl(sft: tuple, **kw: Any) -> RLConfig:
    """An RL config from ``sft``'s checkpoint, one iteration unless said, short episodes; the
    rollout's settings among ``kw`` go into ``rollout``, as a config file nests them."""
    rollout = {**SHORT, **{k: kw.pop(k) for k in list(kw) if k in _ROLLOUT}}
    data = {"policy": sft[0].checkpoint_id, "iterations": 1, **kw, "rollout": rollout}
    return config_from_mapping(RLConfig, data)


@pytest.fixture(scope="module")
def rl(home: str, sft: tuple, dataset: tuple) -> tuple[Any, str]:
    # the SFT tasks again (seed 1), with turn-level credit from the rubric's progress: a
    # learning signal even where the samples of a task end alike; the SFT dataset anchors it.
    # The update runs on two processes (DDP over gloo): rank 0 reports, this process records.
    cfg = _rl(sft, estimator="turn", samples=2, n_tasks=3, seed=1,
              anchor_dataset=dataset[0].dataset_id, anchor_coef=0.5,
              compute={"num_processes": 2})  # fmt: skip
    return run(train_rl_flow, cfg, home)


def test_collect(home: str, collected: tuple):
    out, fr = collected
    assert out.ran == 6 and sum(out.by_status.values()) == 6
    rows = sql(home, "SELECT status, n_steps FROM trajectories WHERE run_id = ?", [out.run_id])
    assert len(rows) == 6 and sum(n for _, n in rows) == out.steps > 0
    statuses = {s for s, _ in rows}
    assert "success" in statuses and "failure" in statuses, statuses  # both, for the stages on
    row = run_row(home, out.run_id)
    assert (row["status"], row["config"]["flow_run_id"]) == ("completed", fr)


def test_judge(home: str, collected: tuple, judged: tuple):
    run_id = collected[0].run_id
    out, fr = judged
    assert out.judged == 6 and out.errors == 0
    verdicts = dict(
        sql(
            home,
            "SELECT t.status, j.verdict FROM judgments j JOIN trajectories t USING (traj_id) "
            "WHERE t.run_id = ? AND j.judge = 'programmatic' GROUP BY ALL",
            [run_id],
        )
    )
    assert verdicts == {"success": "success", "failure": "failure"}  # the checker's outcome
    row = run_row(home, out.run_id)
    assert (row["kind"], row["config"]["flow_run_id"]) == ("judge", fr)


def test_score_steps(home: str, collected: tuple):
    cfg = ScoreStepsConfig(run=collected[0].run_id, k=2, max_states=2, concurrency=1)
    out, fr = run(score_steps_flow, cfg, home)
    assert (out.states, out.candidates, out.errors) == (2, 4, 0)
    scores = sql(home, "SELECT score, advantage FROM step_scores WHERE scorer = 'exact'")
    assert len(scores) == 4 and all(s is not None for s, _ in scores)
    assert abs(sum(a for _, a in scores)) < 1e-6  # group-relative: they sum to 0 per state
    row = run_row(home, out.run_id)
    assert (row["status"], row["config"]["flow_run_id"]) == ("completed", fr)


def test_intervene(home: str, collected: tuple):
    cfg = InterveneConfig(run=collected[0].run_id, max_trajectories=1, concurrency=1)
    out, fr = run(intervene_flow, cfg, home)
    assert out.selected == 1 and out.intervened + out.no_error_found == 1
    rows = sql(home, "SELECT traj_id, verified_outcome FROM interventions")
    assert len(rows) == 1
    assert run_row(home, out.run_id)["config"]["flow_run_id"] == fr
    assert f"run `{out.run_id}`" in artifact("interventions-expert", fr)


def test_curate(home: str, collected: tuple, dataset: tuple):
    out, fr = dataset
    successes = sum(
        1 for (s,) in sql(home, "SELECT status FROM trajectories WHERE run_id = ?",
                          [collected[0].run_id]) if s == "success"
    )  # fmt: skip
    members = sql(
        home,
        "SELECT count(DISTINCT traj_id), count(*) FILTER (WHERE step_idx IS NOT NULL) "
        "FROM dataset_members WHERE dataset_id = ?",
        [out.dataset_id],
    )[0]
    assert members[0] == successes and members[1] == out.counts["sft"] > 0
    md = artifact("dataset-stage-set", fr)
    assert out.dataset_id in md and f"| sft | {out.counts['sft']} |" in md
    comp = [line for line in md.splitlines() if line.startswith("| ") and "| expert |" in line]
    assert comp  # (the verdict filter kept successes only: the counts equal theirs)
    assert sum(int(line.split("|")[4]) for line in comp) == successes
    assert sum(int(line.split("|")[5]) for line in comp) == members[1]


def test_train_sft(home: str, sft: tuple):
    out, fr = sft
    rows = sql(
        home, "SELECT status, config FROM training_runs WHERE training_run_id = ?",
        [out.training_run_id],
    )  # fmt: skip
    assert rows[0][0] == "completed" and _json(rows[0][1])["flow_run_id"] == fr
    losses = sql(
        home,
        "SELECT value FROM metrics WHERE training_run_id = ? AND name = 'loss' ORDER BY step",
        [out.training_run_id],
    )
    assert len(losses) == out.last_step > 0
    assert Path(out.checkpoint, "config.json").exists()
    md = artifact("training-sft", fr)
    assert f"| loss | {len(losses)} |" in md and out.checkpoint_id in md


def test_evaluate(home: str, sft: tuple, eval_sft: tuple):
    out, fr = eval_sft
    s = out.summary
    assert s.n + sum(s.excluded.values()) == 2 and out.deltas == ()
    row = sql(home, "SELECT n, n_success, checkpoint_id, breakdown FROM evaluations "
                    "WHERE evaluation_id = ?", [out.evaluation_id])  # fmt: skip
    assert row[0][:3] == (s.n, s.n_success, sft[0].checkpoint_id)
    assert _json(row[0][3])["flow_run_id"] == fr
    md = artifact("evaluation-bundled-test", fr)
    assert f"| bundled/test | {s.n_success}/{s.n} |" in md
    assert run_row(home, out.run_id)["kind"] == "collect"


def test_train_rl(home: str, sft: tuple, dataset: tuple, rl: tuple):
    anchor = dataset[0].dataset_id
    out, fr = rl
    it = out.iterations[0]
    assert it.trajectories == 6 and it.nonzero_advantage > 0
    rows = sql(home, "SELECT count(*) FROM trajectories WHERE run_id = ?", [it.collect_run])
    assert rows[0][0] == 6 and run_row(home, it.collect_run)["status"] == "completed"
    q = "SELECT status, config, dataset_id FROM training_runs WHERE training_run_id = ?"
    status, config, dataset_id = sql(home, q, [out.training_run_id])[0]
    assert status == "completed" and _json(config)["flow_run_id"] == fr
    assert dataset_id == anchor  # the lineage names the anchor the update trained on too
    q = "SELECT count(*) FROM metrics WHERE training_run_id = ? AND name = 'anchor_loss'"
    assert sql(home, q, [out.training_run_id])[0][0] == it.steps_run > 0
    assert out.checkpoint_id != sft[0].checkpoint_id
    assert "## Iterations" in artifact("training-rl", fr)
    state = json.loads((Path(out.checkpoint) / "trainer_state.json").read_text())
    assert state["parallel"]["world_size"] == 2  # the update ran on two ranks


def test_train_rl_rewards_are_the_reward_judges_verdicts(home: str, sft: tuple):
    """``--reward-judge rubric_vlm``: each iteration's rollouts are judged by a rubric judge
    over a local OpenAI-protocol server (a stand-in for a paid judge model, its verdicts scripted
    per task: success, and a reply it cannot parse for one task). The rewards are its verdicts,
    not the checkers' outcomes; the trajectories it could not decide get no reward."""
    from tests.rollouts.fake_openai import FakeOpenAI, last_user_text

    seed = 6
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""), read_only=True) as wh:
        from stages.collect import select_tasks

        tasks = select_tasks(wh, CollectConfig(n_tasks=2, seed=seed))
    undecided = tasks[0].instruction

    def model(body):
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. do what the task asks"
        return "no verdict" if undecided in text else json.dumps({"verdict": "success"})

    with FakeOpenAI([], default=("fn", model)) as fake:
        judge = {
            "judge": "rubric_vlm",
            "base_url": fake.url,
            "model": "rm",
            "selection": "heuristic",
        }
        cfg = _rl(sft, estimator="grpo", samples=2, n_tasks=2, seed=seed, judge=judge)
        cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_steps=2))
        out, _ = run(train_rl_flow, cfg, home)
    [it] = out.iterations
    statuses = dict(
        sql(home, "SELECT traj_id, status FROM trajectories WHERE run_id = ?", [it.collect_run])
    )
    assert set(statuses.values()) != {"success"}  # two steps: the checkers say failure
    verdicts = dict(
        sql(
            home,
            "SELECT j.traj_id, coalesce(j.verdict, 'error') FROM judgments j JOIN trajectories t "
            "USING (traj_id) WHERE t.run_id = ? AND j.judge = 'rubric_vlm'",
            [it.collect_run],
        )
    )
    assert sorted(verdicts.values()) == ["error", "error", "success", "success"]
    assert it.trajectories == 4 and it.mean_reward == 1.0  # the judge's, not the checkers'
    assert it.stats["rewarded_rows"] < it.stats["rows"]  # the undecided task's turns: no reward
    config = _json(
        sql(home, "SELECT config FROM training_runs WHERE training_run_id = ?",
            [out.training_run_id])[0][0]
    ) if out.training_run_id else cfg.identity()  # fmt: skip
    assert config["reward_judge"]["judge"] == "rubric_vlm"


def test_train_rl_without_a_learning_signal_leaves_the_policy_unchanged(home: str, sft: tuple):
    # groups of one sample: every GRPO advantage is 0, so the iteration makes no update (and
    # the run does not fail); the result is the start checkpoint
    cfg = _rl(sft, estimator="grpo", samples=1, n_tasks=2, seed=2)
    out, _ = run(train_rl_flow, cfg, home)
    [it] = out.iterations
    assert it.trajectories == 2 and it.turns > 0
    assert it.nonzero_advantage == 0 and it.steps_run == 0
    assert out.checkpoint_id == it.checkpoint_id == sft[0].checkpoint_id
    assert out.training_run_id is None  # no run was registered: nothing trained


def test_train_rl_failures_first_samples_on_the_tasks_its_greedy_probe_failed(
    home: str, sft: tuple
):
    # a pool of 4 tasks probed greedily (a collect run of its own), then 2 of them sampled:
    # those the probe did not solve first, then solved ones, in the seeded order (grpo on
    # groups of one: no update, so the check costs two small collections)
    cfg = _rl(sft, estimator="grpo", samples=1, n_tasks=2, task_pool=4, seed=4)
    out, _ = run(train_rl_flow, cfg, home)
    [it] = out.iterations
    probe_run = f"{it.collect_run}-probe"
    probe = run_row(home, probe_run)
    assert probe["status"] == "completed" and probe["config"]["n_tasks"] == 4
    assert probe["config"].get("temperature", 0.0) == 0.0  # greedy (the default is not stored)
    assert run_row(home, it.collect_run)["config"]["temperature"] == 1.0  # then sampled
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        from stages.collect import select_tasks

        order = [t.task_id for t in select_tasks(wh, CollectConfig(n_tasks=4, seed=4))]
    status = dict(sql(home, "SELECT task_id, status FROM trajectories WHERE run_id = ?",
                      [probe_run]))  # fmt: skip
    assert sorted(status) == sorted(order)
    expected = [t for t in order if status[t] != "success"] + [
        t for t in order if status[t] == "success"
    ]
    sampled = sql(home, "SELECT task_id FROM trajectories WHERE run_id = ?", [it.collect_run])
    assert sorted(r[0] for r in sampled) == sorted(expected[:2])
    # the iteration's run was given the picked tasks (absent without the curriculum, even where
    # the seeded order happens to start with the probe's failures)
    assert run_row(home, it.collect_run)["config"]["task_ids"] == expected[:2]
    with pytest.raises(Exception, match="task_pool 2 must exceed n_tasks 2"):
        run(train_rl_flow, _rl(sft, n_tasks=2, task_pool=2, iterations=2), home)


def test_evaluate_newest_shows_the_delta(home: str, sft: tuple, eval_sft: tuple, rl: tuple):
    out, fr = run(evaluate_newest_flow, split="test", n=2, max_steps=8, concurrency=2, home=home)
    assert out.checkpoint_id == rl[0].checkpoint_id  # the newest
    [delta] = out.deltas
    first = eval_sft[0]
    assert delta["a"] == first.evaluation_id and delta["b"] == out.evaluation_id
    assert delta["diff"] == pytest.approx(
        out.evaluation.success_rate - first.evaluation.success_rate
    )
    # both rolled out the same seeded test tasks: the delta is paired on them
    assert delta["method"] == "paired" and delta["n_pairs"] == 2, delta
    md = artifact("evaluation-bundled-test", fr)
    assert f"| {first.evaluation_id} | {sft[0].checkpoint_id} |" in md
    assert f"{delta['diff']:+.1%}" in md and "| paired on 2 tasks" in md


def test_train_rl_step_grpo_scores_the_states_it_visited(home: str, sft: tuple):
    # step_grpo: at each visited state K candidates sampled from the policy (T = 1), scored by
    # the exact PRM (replay, candidate, reference continuation), advantages within the state
    cfg = _rl(sft, estimator="step_grpo", samples=1, n_tasks=2, seed=3,
              prm={"k": 3, "max_states": 4})  # fmt: skip
    out, _ = run(train_rl_flow, cfg, home)
    [it] = out.iterations
    rows = sql(
        home,
        "SELECT c.policy, count(*), count(s.score), count(DISTINCT (c.traj_id, c.step_idx)), "
        "count(DISTINCT s.score) FROM candidates c JOIN trajectories t USING (traj_id) "
        "LEFT JOIN step_scores s USING (traj_id, step_idx, cand_idx) "
        "WHERE t.run_id = ? AND s.scorer = 'exact' GROUP BY 1",
        [it.collect_run],
    )
    [(policy, n, scored, states, distinct)] = rows
    # every step of the iteration's finished trajectories is a state, up to the budget of 4
    [(visited,)] = sql(
        home,
        "SELECT count(*) FROM steps JOIN trajectories USING (traj_id) WHERE run_id = ?",
        [it.collect_run],
    )
    assert states == min(4, visited) > 0
    assert (policy, n, scored) == ("ranker", 3 * states, 3 * states) and distinct > 1
    # every scored candidate is a turn; the states whose candidates differ give the signal
    assert it.turns == 3 * states and it.nonzero_advantage > 0 and it.steps_run > 0
    q = "SELECT training_run_id FROM checkpoints WHERE checkpoint_id = ?"
    assert sql(home, q, [out.checkpoint_id]) == [(out.training_run_id,)]
    assert out.checkpoint_id != sft[0].checkpoint_id


def test_train_rl_step_awr_regresses_on_the_scored_candidates(home: str, sft: tuple):
    # step_awr: the same scored states as step_grpo, but the update is weighted regression
    # (exp(A/beta) where a state's candidates differ, 0 elsewhere), not PPO's clipped ratio
    cfg = _rl(sft, estimator="step_awr", samples=1, n_tasks=2, seed=3,
              prm={"k": 3, "max_states": 4})  # fmt: skip
    out, _ = run(train_rl_flow, cfg, home)
    [it] = out.iterations
    assert it.turns > 0 and it.nonzero_advantage > 0 and it.steps_run > 0
    names = {
        n for (n,) in sql(home, "SELECT DISTINCT name FROM metrics WHERE training_run_id = ?",
                          [out.training_run_id])
    }  # fmt: skip
    assert "loss" in names and "clip_fraction" not in names  # weighted regression, not PPO
    config = _json(sql(home, "SELECT config FROM training_runs WHERE training_run_id = ?",
                       [out.training_run_id])[0][0])  # fmt: skip
    assert config["estimator"] == "step_awr"
    assert out.checkpoint_id != sft[0].checkpoint_id


def test_train_rl_dagger_labels_states_while_rolling_out_and_keeps_them(home: str, sft: tuple):
    # step_best by the reference scorer: the rollouts label their states with the reference's
    # next step on the live page; candidates are scored against the labels (no replay); the
    # update regresses onto the best candidate; buffer: iteration 2 trains on both iterations'
    cfg = _rl(sft, estimator="step_best", samples=1, n_tasks=2, seed=5, iterations=2,
              buffer=True, prm={"scorer": "reference", "k": 2, "candidates": "top_k",
                                "expert_candidate": True, "max_states": 6})  # fmt: skip
    out, _ = run(train_rl_flow, cfg, home)
    first, second = out.iterations
    metas = sql(
        home,
        "SELECT meta FROM trajectories WHERE run_id IN (?, ?)",
        [first.collect_run, second.collect_run],
    )
    labels = [lab for (m,) in metas for lab in _json(m)["reference_labels"]]
    assert labels and any(lab is not None for lab in labels)
    scored = sql(
        home,
        "SELECT t.run_id, count(*), count(DISTINCT s.score) FROM step_scores s "
        "JOIN trajectories t USING (traj_id) WHERE s.scorer = 'reference' GROUP BY 1",
    )
    assert {r for r, *_ in scored} >= {first.collect_run} and all(d == 2 for *_, d in scored)
    assert first.nonzero_advantage > 0 and first.steps_run > 0
    assert second.turns >= first.turns + 2  # the first iteration's states are kept
    assert out.checkpoint_id != sft[0].checkpoint_id


def test_maintain_warehouse(home: str):
    before = sql(home, "SELECT count(*) FROM trajectories")[0][0]
    out, fr = run(maintain_warehouse, keep_recent_minutes=0.0, home=home)
    rep = out.report
    assert rep.files_after <= rep.files_before and rep.snapshots_expired
    assert sql(home, "SELECT count(*) FROM trajectories")[0][0] == before  # nothing lost
    row = run_row(home, out.run_id)
    assert (row["kind"], row["status"], row["config"]["flow_run_id"]) == (
        "maintain", "completed", fr,
    )  # fmt: skip
    assert f"{rep.files_before} → {rep.files_after}" in artifact("maintain-warehouse", fr)
