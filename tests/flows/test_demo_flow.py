"""The demo's configuration: the flywheel at CPU scale. The demo itself runs in
``test_flywheel.py``: it continues a flywheel killed in round 2, then ``webloop demo`` again finds
everything done and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_demo_config_is_the_cpu_scale_flywheel():
    from flows.demo import demo_config
    from stages.flywheel import FlywheelError
    from warehouse.config import ConfigError

    cfg = demo_config(seed=1, rounds=2)
    cfg.check()
    assert (cfg.rounds, cfg.seed) == (2, 1)
    assert cfg.flywheel_id != demo_config(seed=2, rounds=2).flywheel_id
    assert cfg.flywheel_id == demo_config(seed=1, rounds=2, concurrency=1).flywheel_id
    assert cfg.horizon(1) < cfg.horizon(2) == cfg.horizon(5)  # the recipe's schedule
    with pytest.raises(ConfigError, match="rounds: 0 is below the minimum 1"):
        demo_config(rounds=0)
    with pytest.raises(FlywheelError, match=r"rollout\.policy: 'hf'; this flywheel runs"):
        demo_config(rollout={"policy": "hf"}).check()
    with pytest.raises(FlywheelError, match=r"eval\.suite: 'om2w'"):
        demo_config(eval={"suite": "om2w"}).check()
    assert (cfg.expert.n_tasks, cfg.rollout.samples, cfg.eval.n_tasks) == (40, 2, 24)


def test_every_preset_loads_and_checks():
    from stages.config import load_config
    from stages.flywheel import FlywheelConfig

    presets = sorted((ROOT / "stages" / "presets").glob("*.yaml"))
    assert [p.name for p in presets] == ["demo.yaml"]
    for path in presets:
        load_config(FlywheelConfig, path).check()
