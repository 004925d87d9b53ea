"""The demo's configuration: the flywheel at CPU scale. The demo itself runs in
``test_flywheel.py``: it continues a flywheel killed in round 2, then ``webloop demo`` again finds
everything done and starts nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_demo_config_is_the_cpu_scale_flywheel():
    from flows.demo import demo_config
    from warehouse.config import ConfigError

    cfg = demo_config(seed=1, rounds=2)
    cfg.check()
    assert (cfg.rounds, cfg.seed) == (2, 1)
    assert cfg.flywheel_id != demo_config(seed=2, rounds=2).flywheel_id
    assert cfg.flywheel_id == demo_config(seed=1, rounds=2, concurrency=1).flywheel_id
    assert cfg.horizon(1) < cfg.horizon(2) == cfg.horizon(5)  # the recipe's schedule
    with pytest.raises(ConfigError, match="rounds: 0 is below the minimum 1"):
        demo_config(rounds=0)
    assert (cfg.expert.n_tasks, cfg.rollout.samples, cfg.eval.n_tasks) == (40, 2, 24)
    # every failure of the policy's labelled rollouts corrected, curated by the corrected recipe
    assert (cfg.teacher.teacher, cfg.rollout.engine, cfg.interventions) == (
        "labels",
        {"label_reference": True},
        16,
    )
    names = [f.name for f in cfg.load_recipe().filters]
    assert names[0] == "before_first_error" and "verdict" not in names
    assert cfg.load_recipe().include.interventions
    assert tuple(cfg.load_recipe().gates.success_rate) == (0.0, 1.0)  # failures' prefixes kept
    judged = demo_config(teacher={"teacher": "expert"}).load_recipe()
    assert judged.filters[0].name == "verdict"  # the other teachers: successes


RUBRIC = {"judge": "rubric_vlm", "base_url": "http://127.0.0.1:9/v1", "model": "j"}
OPENAI = {"teacher": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "t"}
VLM = {"kind": "hf", "model": "tiny-idefics"}
BOTH = {"prompt_mode": "both"}


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"rollout": {"policy": "hf"}}, r"rollout\.policy: 'hf'; this flywheel rolls out the"),
        ({"eval": {"suite": "om2w"}}, r"eval_judge: none \(the rollouts' own grading\) decides"),
        ({"policy": {"kind": "hf"}}, r"policy\.model: policy\.kind hf needs a checkpoint"),
        ({"policy": VLM}, r"expert\.prompt_mode: 'a11y' records no screenshots"),
        ({"policy": {"model": "x"}}, r"policy\.model: the ranker starts fresh"),
        ({"rollout": {"suite": "om2w"}}, r"judge: programmatic needs tasks with checkers"),
        (
            {"rollout": {"suite": "om2w"}, "judge": RUBRIC, "teacher": {"teacher": "expert"}},
            r"teacher\.teacher: the expert teacher corrects bundled tasks only",
        ),
        (
            {"rollout": {"suite": "om2w"}, "judge": RUBRIC},
            r"teacher\.teacher: the labels teacher reads the bundled reference's labels",
        ),
        (
            {"rollout": {"engine": {}}},
            r"teacher\.teacher: the labels teacher needs the policy's rollouts to record",
        ),
        ({"expert": {"suite": "om2w"}}, r"expert\.policy: the scripted expert plays the bundled"),
        (
            {
                "expert": {"suite": "om2w", "policy": "openai"},
                "judge": RUBRIC,
                "prm": {"scorer": "exact"},
            },
            r"prm\.scorer: exact needs bundled tasks with a reference solution, suite .om2w.",
        ),
        ({"teacher": {"teacher": "openai"}}, r"teacher\.base_url: the openai teacher needs"),
        ({"prm": {"scorer": "vlm"}}, r"prm\.scorer_base_url: the vlm scorer needs an endpoint"),
        (
            {"expert": {"engine": {}}},
            r"prm\.scorer: reference .* runs of expert record none: set "
            r"expert\.engine\.label_reference: true, or",
        ),
        ({"train_sft": False}, r"train_sft: with train_rl off too, no round would train"),
        (
            {"judge": RUBRIC, "recipe": "curation/recipes/filtered-bc.yaml"},
            r"recipe: filters\[0\]\.verdict names judge 'programmatic', but the flywheel",
        ),
        (
            {"train_rl": True, "rl": {"rollout": {"suite": "om2w"}}},
            r"rl\.judge: none \(rewards from own outcomes\)",
        ),
    ],
)
def test_a_flywheel_that_cannot_work_is_refused_naming_the_setting(settings, error):
    from flows.demo import demo_config
    from stages.flywheel import FlywheelError

    with pytest.raises(FlywheelError, match=error):
        demo_config(**settings).check()


def test_a_vlm_flywheel_with_your_judge_and_teacher_checks_and_has_its_own_id():
    from flows.demo import demo_config

    cfg = demo_config(
        policy=VLM,
        expert=BOTH,
        rollout=BOTH,
        eval=BOTH,
        judge=RUBRIC,
        teacher=OPENAI,
        prm={"scorer": "vlm", "scorer_base_url": "http://127.0.0.1:9/v1", "scorer_model": "p"},
    )
    cfg.check()
    rl_only = demo_config(train_sft=False, train_rl=True)
    rl_only.check()
    ids = {cfg.flywheel_id, demo_config().flywheel_id, demo_config(judge=RUBRIC).flywheel_id}
    assert len(ids | {rl_only.flywheel_id}) == 4


def test_every_preset_loads_and_checks():
    from stages.config import load_config
    from stages.evaluate import EvalConfig
    from stages.flywheel import FlywheelConfig
    from stages.judge import check_judge
    from stages.train import RLConfig

    kinds = {"demo.yaml": FlywheelConfig, "rl-vlm.yaml": RLConfig}
    kinds["eval-live-web.yaml"] = EvalConfig
    kinds["flywheel-vlm.yaml"] = kinds["flywheel-live-web.yaml"] = FlywheelConfig
    presets = sorted((ROOT / "stages" / "presets").glob("*.yaml"))
    assert sorted(p.name for p in presets) == sorted(kinds)
    for path in presets:
        cfg = load_config(kinds[path.name], path)
        cfg.check()
        if hasattr(cfg, "judge"):
            check_judge(cfg.judge)
    rl = load_config(RLConfig, ROOT / "stages" / "presets" / "rl-vlm.yaml")
    assert (rl.serve, rl.judge.judge, rl.rollout.samples, rl.rollout.temperature) == (
        "auto",
        "rubric_vlm",
        4,
        1.0,
    )


def test_the_flywheel_s_judges_are_configs(tmp_path):
    """The rollouts' judge (whose successes the default recipe keeps) and the evaluations' judge
    are judge configs: a rubric judge on a local OpenAI-protocol stand-in judges a run's
    trajectories; the default recipe names it; the evaluations take theirs; a bad judge is
    refused before anything starts; the defaults keep the flywheel's id."""
    from flows.demo import demo_config
    from stages.flywheel import eval_config, judge_run
    from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
    from warehouse import Warehouse, WarehouseConfig, sample
    from warehouse.config import ConfigError

    def model(body):
        if "List the key points" in last_user_text(body):
            return "1. done"
        return json.dumps({"verdict": "success"})

    home = str(tmp_path / "home")
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        data = sample.generate(seed=4, n_tasks=2, samples=1)
        sample.load(wh, data)
    with FakeOpenAI([], default=("fn", model)) as fake:
        rubric = {"judge": "rubric_vlm", "base_url": fake.url, "model": "j", "k": 2}
        cfg = demo_config(judge=rubric, eval_judge=rubric)
        cfg.check()
        out = judge_run(home, cfg, data.run.run_id)
    assert out["judge"] == "rubric_vlm" and out["judged"] == len(data.trajectories)
    [verdict] = [f for f in cfg.load_recipe().filters if f.name == "verdict"]
    assert verdict.params.judges == ("rubric_vlm",)
    assert eval_config(cfg, "ck").judge.judge == "rubric_vlm"
    assert eval_config(demo_config(), "ck").judge.judge == "none"  # the rollouts' own grading
    assert cfg.flywheel_id != demo_config().flywheel_id == demo_config(judge={}).flywheel_id
    with pytest.raises(ConfigError, match="judge 'nope'"):
        demo_config(judge={"judge": "nope"}).check()
