"""Run ids are named by configurations, and users' warehouses resume by them: the ids of these
configurations are pinned (computed before the stage configs moved and composed; a change here
means an existing warehouse would redo its runs instead of resuming them)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from warehouse.ids import run_id_for

# The demo preset before its flywheel corrected every failure with the labels teacher and
# scored states with the reference scorer (the ids pinned here are of that configuration,
# which users' warehouses hold)
BEFORE_REFERENCE = {"prm": {"scorer": "exact"}}  # (and the expert's rollouts unlabelled)
OLD_DEMO = {
    "interventions": 2,
    "teacher": {"teacher": "expert"},
    "rollout": {"engine": {}, "n_tasks": 8},
    "expert": {"engine": {}},
    **BEFORE_REFERENCE,
}


def _ids() -> dict[str, str]:
    from flows.demo import demo_config
    from stages.collect import CollectConfig
    from stages.evaluate import EvalConfig, collect_config, eval_rollout
    from stages.intervene import InterveneConfig
    from stages.judge import JudgeConfig
    from stages.score_steps import ScoreStepsConfig
    from stages.train import RLConfig, SFTConfig, _collect_config, _score_config, rl_prm, rl_rollout
    from training import registry

    openai = CollectConfig(
        policy="openai",
        base_url="http://127.0.0.1:8000/v1",
        model="m",
        n_tasks=20,
        samples=4,
        temperature=1.0,
        prompt_mode="screenshot",
    )
    ranker = CollectConfig(
        policy="ranker",
        model="/ck",
        split="test",
        n_tasks=300,
        engine={"max_repeats": 3},
        action_timeout_s=3.0,
    )
    rubric = JudgeConfig(
        judge="rubric_vlm",
        options={"base_url": "http://h/v1", "model": "m", "k": 3, "selection": "last"},
        run="r1",
    )
    scored = ScoreStepsConfig(k=3, max_states=4, select="uncertain", run="r1")
    rl_step = RLConfig(
        policy="/ck",
        estimator="step_grpo",
        anchor_dataset="ds-a",
        anchor_coef=0.5,
        rollout=replace(rl_rollout(), n_tasks=8, samples=3, temperature=0.7, seed=4, max_steps=12),
        prm=replace(rl_prm(), k=3, max_states=5, candidates="sample"),
    )
    rl_pool = RLConfig(
        policy="/ck",
        task_pool=20,
        rollout=replace(rl_rollout(), n_tasks=8, samples=3),
        prm=replace(rl_prm(), k=3),  # not a step-level estimator: not in the id
    )
    ev = EvalConfig(
        max_repeats=0,
        checkpoint="c",
        rollout=replace(
            eval_rollout(), split="ood", n_tasks=7, max_steps=9, seed=2, temperature=0.5
        ),
    )
    current = SimpleNamespace(policy="ranker", model="/ck/iter", prompt_mode="a11y")
    later_collect = CollectConfig(
        inject_answer=True,
        action_timeout_s=2.0,
        task_ids=("a",),
        screenshots="last",
        temperature=0.3,
        noise_kind="habit",
        a11y_chars=100,
        a11y_focus=True,
        choose="rank",
    )
    judge = {"judge": "rubric_vlm", "base_url": "http://h/v1", "model": "m"}
    rl_judged = RLConfig(policy="/ck", buffer=True, task_pool=5, judge=JudgeConfig(**judge))
    return {
        "collect default": run_id_for("collect", CollectConfig().identity()),
        "collect openai": run_id_for("collect", openai.identity()),
        "collect ranker": run_id_for("collect", ranker.identity()),
        "judge": run_id_for("judge", JudgeConfig().identity()),
        "judge rubric": run_id_for("judge", rubric.identity()),
        "score": run_id_for("score_steps", ScoreStepsConfig().identity()),
        "score selected": run_id_for("score_steps", scored.identity()),
        "intervene": run_id_for("intervene", InterveneConfig().identity()),
        "sft": registry.training_run_id(
            "sft", "ranker", "ds-1", SFTConfig(dataset="ds-1").identity()
        ),
        "rl": registry.training_run_id("rl", "ranker", None, RLConfig(policy="/ck").identity()),
        "eval": run_id_for(
            "collect", collect_config(EvalConfig(checkpoint="c"), "/ck", "a11y").identity()
        ),
        "flywheel": demo_config(**OLD_DEMO).flywheel_id,
        "flywheel seed 1": demo_config(
            interventions=2,
            teacher={"teacher": "expert"},
            seed=1,
            rounds=3,
            rollout={"temperature": 0.7, "engine": {}, "n_tasks": 8},
            eval={"max_steps": 20},
            expert={"max_steps": 22, "engine": {}},
            **BEFORE_REFERENCE,
        ).flywheel_id,
        "flywheel timeout": demo_config(
            teacher={"teacher": "expert"},
            bundled_tasks=60,
            expert={"n_tasks": 4, "noise": 0.12, "action_timeout_s": 1.0, "engine": {}},
            rollout={"n_tasks": 3, "action_timeout_s": 1.0, "engine": {}},
            eval={"n_tasks": 3, "max_steps": 10, "action_timeout_s": 1.0},
            prm_states=2,
            prm_k=2,
            interventions=1,
            epochs=2,
            later_epochs=1,
            **BEFORE_REFERENCE,
        ).flywheel_id,
        "rl step_grpo": registry.training_run_id("rl", "ranker", "ds-a", rl_step.identity()),
        "rl pool": registry.training_run_id("rl", "ranker", None, rl_pool.identity()),
        "eval ood": run_id_for("collect", collect_config(ev, "/ck", "a11y").identity()),
        "rl iteration collect": run_id_for(
            "collect", _collect_config(rl_step, 1, current, "x").identity()
        ),
        "rl iteration score": run_id_for(
            "score_steps", _score_config(rl_step, 1, current, "collect-x").identity()
        ),
        # (pinned when the identities moved to stages/identity.py's one rule: every later
        # setting used, each computed by the code before and after the move alike)
        "collect later settings": run_id_for("collect", later_collect.identity()),
        "score first errors": run_id_for(
            "score_steps", ScoreStepsConfig(select="first_error", expert_candidate=True).identity()
        ),
        "rl judged": registry.training_run_id("rl", "ranker", None, rl_judged.identity()),
        "flywheel rl judged": demo_config(
            train_rl=True, train_sft=False, judge=judge, eval_judge=judge, **BEFORE_REFERENCE
        ).flywheel_id,
    }


PINNED = {
    "collect default": "collect-1906bec4ce61730469aa",
    "collect openai": "collect-c84e9c759f08c1af5822",
    "collect ranker": "collect-e686961153f20089a5f0",
    "judge": "judge-9b0c2215787a4fe3326e",
    "judge rubric": "judge-be9e078c86ea9caad356",
    "score": "score_steps-b29b8b9b224d3519f737",
    "score selected": "score_steps-521e642c898d9f2e2171",
    "intervene": "intervene-1a77bb35a6b770c375b2",
    "sft": "train-sft-926b0c66b14a5ccbd992",
    "rl": "train-rl-49208f746e5a5785a758",
    "eval": "collect-c0d2aa36888008322ac9",
    "flywheel": "flywheel-1e5ee5f62215bd1a85d7",
    # pinned from the flat RL, eval and flywheel configs, before they held the stages' configs
    "flywheel seed 1": "flywheel-904ecf9dce9b45ed4f89",
    "flywheel timeout": "flywheel-da0e62677ceb0d127a1f",
    "rl step_grpo": "train-rl-8988608103b7cb2b846b",
    "rl pool": "train-rl-83d8c425c885fe15b010",
    "eval ood": "collect-2f08c626037b0ca1eab8",
    "rl iteration collect": "collect-532544d13da421947a12",
    "rl iteration score": "score_steps-864f4e71226bd8f91bb2",
    "collect later settings": "collect-ec60a107a8416136af69",
    "score first errors": "score_steps-5793ea5dd0d9074593d5",
    "rl judged": "train-rl-ee2fbbc1a5de2457adb7",
    "flywheel rl judged": "flywheel-3eb31428ddc4dc887417",
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_run_ids_of_existing_configurations_are_unchanged(name: str) -> None:
    assert _ids()[name] == PINNED[name]


def test_a_judge_config_written_with_typed_fields_names_the_same_run_as_its_options() -> None:
    """``webloop judge --judge rubric_vlm --base-url … --model …`` stored
    ``options={base_url, model, k, selection}``; the typed fields give the same run."""
    from stages.judge import JudgeConfig

    typed = JudgeConfig(judge="rubric_vlm", base_url="http://h/v1", model="m", run="r1", k=3)
    legacy = JudgeConfig(
        judge="rubric_vlm",
        options={"base_url": "http://h/v1", "model": "m", "k": 3, "selection": "model"},
        run="r1",
    )
    assert run_id_for("judge", typed.identity()) == run_id_for("judge", legacy.identity())
    assert typed.judge_options() == legacy.judge_options()
    ensemble = JudgeConfig(judge="ensemble", members="programmatic,rubric_vlm")
    assert ensemble.judge_options() == {
        "members": "programmatic,rubric_vlm",
        "rule": "majority",
        "threshold": 0.5,
    }
