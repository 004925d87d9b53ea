"""`webloop collect` end to end: Prefect flow, real Chromium, bundled sites, warehouse; killed
with SIGKILL mid-run and re-run: nothing duplicated, nothing finished lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CMD = ["collect", "--n-tasks", "10", "--concurrency", "2", "--noise", "0.1", "--run", "kill-me"]


def cli(home: Path, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
    env.pop("WEBLOOP_WAREHOUSE", None)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def stored(home: Path) -> dict[str, tuple]:
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        rows = wh.sql(
            "SELECT traj_id, status, n_steps, ended_at FROM trajectories WHERE run_id = 'kill-me'"
        )
    return {r[0]: r[1:] for r in rows.iter_rows()}


def test_collect_killed_and_rerun_keeps_every_finished_trajectory_once(tmp_path: Path):
    home = tmp_path / "home"
    gen = cli(home, "tasks", "generate", "--n", "80")
    assert gen.wait(120) == 0, gen.stderr.read()
    proc = cli(home, *CMD, start_new_session=True)
    deadline = time.monotonic() + 240
    before: dict[str, tuple] = {}
    while time.monotonic() < deadline and len(before) < 2:
        time.sleep(1)
        if (home / "lake").exists():
            try:
                before = stored(home)
            except Exception:
                before = {}
        assert proc.poll() is None, proc.stderr.read()
    assert len(before) >= 2, "the collector stored nothing in time"
    os.killpg(proc.pid, signal.SIGKILL)  # the collector, its browsers and its sites server
    proc.wait(30)
    before = stored(home)
    assert 2 <= len(before) < 10

    rerun = cli(home, *CMD)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"skipped {len(before)} already stored" in out
    after = stored(home)
    assert len(after) == 10
    for tid, row in before.items():
        assert after[tid] == row  # kept as it was, not redone
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        dup = wh.sql("SELECT count(*) - count(DISTINCT traj_id) FROM trajectories").item()
        mismatched = wh.sql(
            "SELECT count(*) FROM trajectories t LEFT JOIN (SELECT traj_id, count(*) AS n, "
            "count(DISTINCT step_idx) AS d FROM steps GROUP BY 1) s USING (traj_id) "
            "WHERE coalesce(s.n, 0) <> t.n_steps OR coalesce(s.d, 0) <> t.n_steps"
        ).item()
        run = wh.sql("SELECT status FROM runs WHERE run_id = 'kill-me'").item()
    assert dup == 0 and mismatched == 0 and run == "completed"


def test_collect_options_reach_the_environment_and_prompts():
    from flows.collect import CollectConfig, env_config, make_policy_for, prompt_config
    from warehouse import WarehouseError

    cfg = CollectConfig(
        coords="norm1000",
        set_of_marks=True,
        prompt_mode="a11y",
        k_images=1,
        self_summary=True,
        policy="openai",
        base_url="http://127.0.0.1:9/v1",
        model="m",
    )
    env = env_config(cfg)
    assert (env.coords, env.set_of_marks) == ("norm1000", True)
    policy = make_policy_for(cfg)
    assert (policy.prompt.mode, policy.prompt.k_images, policy.prompt.self_summary) == (
        "a11y",
        1,
        True,
    )
    assert "concurrency" not in cfg.identity()  # resuming with other concurrency: same run
    for bad in (CollectConfig(coords="inches"), CollectConfig(prompt_mode="audio")):
        with pytest.raises(WarehouseError):
            env_config(bad)
            prompt_config(bad)
    with pytest.raises(WarehouseError, match="needs --base-url and --model"):
        make_policy_for(CollectConfig(policy="openai"))
