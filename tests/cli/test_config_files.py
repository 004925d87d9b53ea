"""Every command whose options derive from a stage config takes ``--config FILE.yaml``: the
same settings given as flags or written to a file make the same config (so the same run id and
the same rows); flags given beside a file override it; a bad file names its line and field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from cli import options
from stages.config import dump_config
from tests.cli.cli_runner import webloop
from warehouse import Warehouse, WarehouseConfig, sample

# command path → flags that move several settings off their defaults (one of each kind: a
# number, a choice, a flag, a repeatable option, an optional text)
COMMANDS: dict[tuple[str, ...], list[str]] = {
    ("collect",): [
        *("--n-tasks", "7", "--samples", "3", "--policy", "random", "--coords", "norm1000"),
        *("--set-of-marks", "--allow-origin", "http://a.test", "--allow-origin", "http://b.test"),
        *("--split", "", "--no-screenshots", "--run", "mine", "--action-timeout", "2.5"),
    ],
    ("judge",): [
        *("--judge", "rubric_vlm", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"),
        *("--k", "2", "--selection", "heuristic", "--attempts", "3"),
    ],
    ("score-steps",): [
        *("--k", "3", "--policy", "random", "--candidates", "top_k", "--max-states", "5"),
        *("--select", "first", "--action-timeout", "1.5"),
    ],
    ("intervene",): ["--teacher", "expert", "--max-trajectories", "2", "--name", "fix-1"],
    ("rationales",): ["--teacher", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
    ("curate",): ["--recipe", "recipe.yaml", "--snapshot", "4"],
    ("train", "sft"): ["--dataset", "ds-1", "--epochs", "2", "--lora-r", "8", "--text-only"],
    ("train", "rl"): [
        *("--policy", "ck-1", "--estimator", "step_awr", "--prm-candidates", "sample"),
        *("--anchor-dataset", "ds-1", "--anchor-coef", "0.5", "--task-pool", "40"),
        *("--n-tasks", "6", "--group-size", "3", "--prm-k", "3", "--prm-max-states", "9"),
    ],
    ("eval",): [
        *("--policy", "expert", "--split", "ood", "--n", "5", "--max-repeats", "0"),
        *("--samples", "2", "--allow-origin", "http://a.test"),
        *("--judge", "rubric_vlm", "--judge-base-url", "http://127.0.0.1:9/v1", "--judge-k", "2"),
    ],
    ("flywheel",): ["--rounds", "3", "--noise", "0.2", "--prm-states", "0", "--eval-n", "12"],
    ("warehouse", "maintain"): ["--keep-recent-minutes", "5"],
}


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The configs the commands were run with (their bodies do not run)."""
    seen: list[Any] = []
    monkeypatch.setattr(options, "run_body", lambda body, cfg, **extra: seen.append(cfg))
    return seen


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    h = tmp_path_factory.mktemp("cfg") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        sample.load(wh, sample.generate(seed=3, n_tasks=2, samples=1))
    return h


def test_every_config_command_is_covered() -> None:
    from cli import app  # noqa: F401  (registers the commands)

    assert {cls.__name__ for cls in options.REGISTERED.values()} == {
        "CollectConfig", "JudgeConfig", "ScoreStepsConfig", "InterveneConfig", "CurateConfig",
        "SFTConfig", "RLConfig", "EvalConfig", "FlywheelConfig", "MaintainConfig",
        "RationalesConfig",
    }  # fmt: skip
    assert len(COMMANDS) == len(options.REGISTERED)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_flags_and_a_config_file_make_the_same_config(
    path: tuple[str, ...], home: Path, tmp_path: Path, configs: list[Any]
) -> None:
    res = webloop(home, *path, *COMMANDS[path], ok=False)
    assert res.returncode == 0, res.stderr
    (from_flags,) = configs
    defaults = [f.name for f in dataclasses.fields(from_flags) if _is_default(from_flags, f)]
    assert len(defaults) < len(dataclasses.fields(from_flags))  # the flags moved settings
    file = tmp_path / "settings.yaml"
    file.write_text(dump_config(from_flags))
    res = webloop(home, *path, "--config", str(file), ok=False)
    assert res.returncode == 0, res.stderr
    assert configs[1] == from_flags
    if hasattr(from_flags, "identity"):
        assert configs[1].identity() == from_flags.identity()  # the same run id


def _is_default(cfg: Any, f: dataclasses.Field) -> bool:
    if f.default is not dataclasses.MISSING:
        return getattr(cfg, f.name) == f.default
    if f.default_factory is not dataclasses.MISSING:
        return getattr(cfg, f.name) == f.default_factory()
    return False


def test_a_stage_holds_the_configs_of_the_stages_it_runs(
    home: Path, tmp_path: Path, configs: list[Any]
) -> None:
    """RL holds a collect config (its rollouts) and a score-steps config (its PRM); a nested
    mapping in a file, or the flags, change only the settings given: the rest keep RL's own
    defaults (temperature 1, top-k candidates), not the collect or score-steps stage's."""
    file = tmp_path / "rl.yaml"
    file.write_text("policy: ck-1\nrollout:\n  n_tasks: 4\nprm:\n  k: 3\n")
    assert webloop(home, "train", "rl", "--config", str(file)).returncode == 0
    assert webloop(home, "train", "rl", "--policy", "ck-1", "--n-tasks", "4", "--prm-k", "3")
    from_file, from_flags = configs
    assert from_file == from_flags
    rollout, prm = from_file.rollout, from_file.prm
    assert (rollout.n_tasks, rollout.samples, rollout.temperature) == (4, 4, 1.0)
    assert (prm.k, prm.candidates, prm.scorer) == (3, "top_k", "exact")
    assert from_file.identity()["n_tasks"] == 4 and from_file.identity()["group_size"] == 4


@pytest.mark.parametrize(
    ("args", "text", "where"),
    [
        (("train", "rl"), "policy: p\nrollout:\n  n_taskz: 4\n", "rl.yaml:3: rollout.n_taskz: "
         "unknown field (did you mean n_tasks?)"),
        (("train", "rl"), "policy: p\nprm:\n  k: 1\n", "rl.yaml:3: prm.k: 1 is below the "
         "minimum 2"),
        (("eval",), "rollout: 3\n", "rl.yaml:1: rollout: Input should be a dictionary"),
    ],
)  # fmt: skip
def test_a_bad_nested_setting_names_its_line_and_path(
    home: Path, tmp_path: Path, configs: list[Any], args: tuple, text: str, where: str
) -> None:
    file = tmp_path / "rl.yaml"
    file.write_text(text)
    res = webloop(home, *args, "--config", str(file), ok=False)
    assert res.returncode == 2 and where in res.stderr, res.stderr
    assert configs == []


def test_a_nested_option_out_of_range_names_its_flag(home: Path, configs: list[Any]) -> None:
    res = webloop(home, "eval", "--n", "0", ok=False)
    assert res.returncode == 2 and "--n" in res.stderr and configs == []


def test_flags_override_the_file_and_only_the_flags_given(
    home: Path, tmp_path: Path, configs: list[Any]
) -> None:
    file = tmp_path / "collect.yaml"
    file.write_text("n_tasks: 9\nmax_steps: 12\npolicy: random\nset_of_marks: true\n")
    res = webloop(home, "collect", "--config", str(file), "--max-steps", "20", "--no-set-of-marks")
    assert res.returncode == 0, res.stderr
    (cfg,) = configs
    assert (cfg.n_tasks, cfg.max_steps, cfg.policy, cfg.set_of_marks) == (9, 20, "random", False)
    assert cfg.seed == 0  # not in the file, not given: the default


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("n_tasks: 9\nmax_stepz: 12\n", "settings.yaml:2: max_stepz: unknown field (did you mean"),
        ("n_tasks: 0\n", "settings.yaml:1: n_tasks: 0 is below the minimum 1"),
        ("n_tasks: 5\ncoords: inches\n", "settings.yaml:2: coords:"),
        ("n_tasks: [1\n", "settings.yaml:2: YAML syntax error"),
        ("a: &x 1\nb: *x\n", "settings.yaml:1: an anchor (&)"),
    ],
)  # fmt: skip
def test_a_bad_config_file_names_its_line_and_field(
    home: Path, tmp_path: Path, configs: list[Any], text: str, where: str
) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text(text)
    res = webloop(home, "collect", "--config", str(file), ok=False)
    assert res.returncode == 2 and where in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and configs == []


def test_a_missing_required_setting_is_a_usage_error(home: Path, configs: list[Any]) -> None:
    res = webloop(home, "train", "sft", ok=False)
    assert res.returncode == 2 and "missing --dataset" in res.stderr and configs == []


def test_a_run_from_a_config_file_names_the_same_run_and_writes_the_same_rows(
    prefect_harness: str, tmp_path: Path
) -> None:
    """The same judge settings as flags (one warehouse) and as a file (a twin warehouse): the
    same run id and the same judgments."""
    homes = [tmp_path / "flags", tmp_path / "file"]
    for h in homes:
        with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
            sample.load(wh, sample.generate(seed=3, n_tasks=3, samples=2))
    flags = ["--judge", "programmatic", "--attempts", "3", "--concurrency", "2"]
    webloop(homes[0], "judge", *flags)
    file = tmp_path / "judge.yaml"
    file.write_text("judge: programmatic\nattempts: 3\nconcurrency: 2\n")
    webloop(homes[1], "judge", "--config", str(file))
    rows = []
    for h in homes:
        with Warehouse.open(WarehouseConfig.from_env(home=h), read_only=True) as wh:
            judged = wh.sql(
                "SELECT j.traj_id, j.verdict, j.run_id FROM judgments j ORDER BY traj_id"
            ).rows()
            runs = wh.sql("SELECT run_id, config FROM runs WHERE kind = 'judge'").rows()
        rows.append((judged, [r[0] for r in runs]))
    assert rows[0] == rows[1] and len(rows[0][0]) >= 4 and len(rows[0][1]) == 1


def test_settings_that_cannot_work_together_are_refused_naming_the_line(
    home: Path, tmp_path: Path, configs: list[Any]
) -> None:
    """A config's own check (settings valid alone, not together) runs before the command does;
    from a file, the error names the line that sets the field."""
    file = tmp_path / "fw.yaml"
    file.write_text("rounds: 1\nrollout:\n  n_tasks: 4\n  policy: hf\n")
    res = webloop(home, "flywheel", "--config", str(file), ok=False)
    assert res.returncode == 2 and "fw.yaml:4: rollout.policy: 'hf'" in res.stderr, res.stderr
    res = webloop(home, "train", "rl", "--policy", "ck-1", "--anchor-coef", "0.5", ok=False)
    assert res.returncode == 2 and "anchor_coef 0.5 needs an anchor dataset" in res.stderr
    # judges and scorers that cannot decide a suite without checkers (an imported one)
    file = tmp_path / "rl.yaml"
    file.write_text("policy: ck-1\nrollout:\n  suite: om2w\n")
    res = webloop(home, "train", "rl", "--config", str(file), ok=False)
    assert res.returncode == 2 and "rl.yaml:1: judge: none (rewards from own outcomes)" in (
        res.stderr
    ), res.stderr
    file.write_text(
        "policy: ck-1\nrollout:\n  suite: om2w\nestimator: step_grpo\n"
        "judge:\n  judge: rubric_vlm\n  base_url: http://127.0.0.1:9/v1\n  model: m\n"
    )
    res = webloop(home, "train", "rl", "--config", str(file), ok=False)
    assert res.returncode == 2
    assert "prm.scorer: exact needs the bundled sites' reference" in res.stderr
    res = webloop(home, "eval", "--policy", "expert", "--suite", "om2w", "--judge", "programmatic",
                  ok=False)  # fmt: skip
    assert res.returncode == 2 and "--judge: programmatic needs tasks with checkers" in res.stderr
    assert configs == []  # no command ran
