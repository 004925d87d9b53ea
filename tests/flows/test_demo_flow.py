"""The demo's configuration: the flywheel at CPU scale. The demo itself runs in
``test_flywheel.py``: it continues a flywheel killed in round 2, then ``webloop demo`` again finds
everything done and starts nothing."""

from __future__ import annotations

import pytest


def test_demo_config_is_the_cpu_scale_flywheel():
    from flows.demo import demo_config
    from stages.flywheel import FlywheelError

    cfg = demo_config(seed=1, rounds=2)
    cfg.check()
    assert (cfg.rounds, cfg.seed) == (2, 1)
    assert cfg.flywheel_id != demo_config(seed=2, rounds=2).flywheel_id
    assert cfg.flywheel_id == demo_config(seed=1, rounds=2, concurrency=1).flywheel_id
    assert cfg.horizon(1) < cfg.horizon(2) == cfg.horizon(5)  # the recipe's schedule
    with pytest.raises(FlywheelError, match="--rounds"):
        demo_config(rounds=0).check()
