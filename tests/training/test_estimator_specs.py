"""Advantage estimators describe themselves (:class:`training.advantages.EstimatorSpec`): the
RL loop, the stage and the CLI ask the spec, so an estimator from the user's own module
(``WEBLOOP_PLUGINS``) runs like a built-in one."""

from __future__ import annotations

import sys

import pytest

from stages.config import ConfigError
from stages.plugins import load_plugins
from stages.train import RLConfig, _collect_config, _rl_train_config
from tests.cli.cli_runner import webloop_subprocess
from tests.training.test_data_and_registry import RUN, built  # noqa: F401
from training.advantages import ESTIMATORS, SPECS, estimator_spec, names_at, register
from training.interface import DataMismatch
from training.rl import prepare
from warehouse.advantage import EPS

PLUGIN = "tests.training.plugin_estimator"


def test_the_built_in_estimators_say_what_they_need():
    assert names_at("step") == ["step_awr", "step_best", "step_grpo"]
    assert names_at("trajectory") == ["awr", "grpo", "turn"]
    assert {n for n, s in SPECS.items() if s.objective == "awr"} >= {"awr", "step_awr", "step_best"}
    assert estimator_spec("grpo").objective == "ppo" and estimator_spec("grpo").inputs is None
    assert estimator_spec("turn").engine == ("record_progress",)
    assert estimator_spec("awr").inputs is not None
    assert estimator_spec("step_awr").options == {"beta": 0.5, "w_max": 20.0, "eps": EPS}
    assert estimator_spec("step_best").summary.startswith("Step-level regression onto the best")
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; known: \['awr'"):
        estimator_spec("ppo")
    # the stage reads the spec: the rollouts' engine settings, the update's objective
    turn = RLConfig(policy="ck", estimator="turn")
    assert _collect_config(turn, 0, _Policy(), "r").engine["record_progress"] is True
    assert _rl_train_config(RLConfig(policy="ck", estimator="step_best"), 0).objective == "awr"
    assert _rl_train_config(RLConfig(policy="ck", estimator="grpo"), 0).objective == "ppo"


class _Policy:
    policy, model, prompt_mode = "ranker", "ck", "a11y"


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match=r"'grpo' is registered already \(training.advantages"):

        @register("grpo")
        def other(frame):  # pragma: no cover - refused at registration
            return frame


@pytest.fixture
def registries():
    """The registries as they were after the test (a plugin's names do not leak into others)."""
    specs, factories = dict(SPECS), dict(ESTIMATORS.factories)
    yield
    SPECS.clear()
    SPECS.update(specs)
    ESTIMATORS.factories.clear()
    ESTIMATORS.factories.update(factories)
    sys.modules.pop(PLUGIN, None)


def test_an_estimator_from_a_plugin_module_runs_in_the_rl_data_path(built, registries):  # noqa: F811
    wh, _, _ = built
    with pytest.raises(DataMismatch, match="unknown advantage estimator 'mean_baseline'"):
        RLConfig(policy="ck", estimator="mean_baseline").check()
    assert load_plugins(f" {PLUGIN} ,") == [PLUGIN]
    RLConfig(policy="ck", estimator="mean_baseline").check()  # known now
    turns, stats = prepare(wh, [RUN], "mean_baseline", scale=2.0)
    reward = {t.key.rsplit("/", 1)[0]: float(t.meta["status"] == "success") for t in turns}
    mean = sum(reward.values()) / len(reward)
    assert 0 < mean < 1  # the fixture's run holds a success and a failure
    for t in turns:
        assert t.advantage == pytest.approx(2.0 * (reward[t.key.rsplit("/", 1)[0]] - mean))
    assert stats["nonzero_advantage"] == len(turns)
    with pytest.raises(ConfigError, match=r"WEBLOOP_PLUGINS: cannot import 'no_such_mod' \("):
        load_plugins("no_such_mod")


def test_the_cli_knows_a_plugin_s_estimator_and_names_a_plugin_it_cannot_import(tmp_path):
    args = ("train", "rl", "--policy", "nope", "--estimator", "mean_baseline")
    r = webloop_subprocess(tmp_path, *args, ok=False)
    assert r.returncode == 2 and "unknown estimator 'mean_baseline'" in r.stderr
    env = {**_env(), "WEBLOOP_PLUGINS": PLUGIN}
    r = webloop_subprocess(tmp_path, *args, ok=False, env=env)
    assert r.returncode == 2 and "no checkpoint 'nope'" in r.stderr  # past the estimator
    r = webloop_subprocess(tmp_path, *args, ok=False, env={**_env(), "WEBLOOP_PLUGINS": "nope_x"})
    assert r.returncode == 2 and "WEBLOOP_PLUGINS: cannot import 'nope_x'" in r.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "WEBLOOP_PLUGINS"}


def test_the_how_to_page_shows_the_plugin_module_as_it_is():
    from pathlib import Path

    root = Path(__file__).parents[2]
    page = (root / "docs" / "how-to" / "add-an-estimator.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (root / "tests" / "training" / "plugin_estimator.py").read_text()
