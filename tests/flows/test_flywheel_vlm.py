"""The VLM flywheel preset (``stages/presets/flywheel-vlm.yaml``) end to end on tiny offline
models: the tiny Idefics3 as the policy; judge, PRM and teacher on one local OpenAI-protocol
server (a stand-in for paid models, which cannot run here: its judge verdicts alternate per
task, its PRM scores 7/10 and every screenshot 3/5 relevant, its teacher answers with the
reference solution's first action).

One round — expert and policy collect with screenshots → rubric judge → VLM PRM → openai
teacher → curate → SFT of the VLM → RL rolled out by the served checkpoint (webloop's hf engine),
synced in place after each update with a log-prob parity check → greedy evaluation — started as
``webloop flywheel`` in its own process group and SIGKILLed mid-RL, at a known point (the
stand-in holds RL iteration 0's last verdict), then continued in-process: nothing is written
twice, the re-run's server starts on the checkpoint RL's next rollouts need, and every table
holds the round's rows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stages.flywheel import DEFAULT_RECIPE
from stages.served import ServedCheckpoints
from tests.rollouts.stand_ins import stand_in
from warehouse import Warehouse, WarehouseConfig

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.long(
        reason=(
            "the VLM preset's whole round killed mid-RL; twins: the ranker flywheel killed and "
            "resumed, tests/flows/test_flywheel.py::"
            "test_killed_in_round_two_then_resumed_redoes_nothing_of_round_one, and served RL "
            "with in-place weight sync, tests/serving/test_supervisor.py::"
            "test_model_server_restart_serves_the_new_checkpoint"
        )
    ),
]
ROOT = Path(__file__).parents[2]
PRESET = ROOT / "stages" / "presets" / "flywheel-vlm.yaml"


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def tiny_settings(url: str) -> dict[str, Any]:
    """The preset, at the smallest size that still exercises every stage, on the stand-in."""
    preset = yaml.safe_load(PRESET.read_text())
    judge = {"judge": "rubric_vlm", "base_url": url, "model": "judge"}
    return merged(
        preset,
        {
            "rounds": 1,
            "bundled_tasks": 40,
            "epochs": 1,
            "lr": 1e-3,
            "concurrency": 2,
            "expert": {"n_tasks": 3, "noise": 0.0, "max_steps": 8},
            "rollout": {"n_tasks": 1, "samples": 2},
            "eval": {"n_tasks": 2, "max_steps": 2},
            "judge": judge,
            "prm_states": 1,
            "prm_k": 2,
            "prm": {"scorer_base_url": url, "scorer_model": "prm"},
            "interventions": 1,
            "teacher": {"base_url": url, "model": "teacher"},
            "rl": {
                "iterations": 2,
                "serve": "hf",
                "lr": 0.05,
                "batch_size": 8,
                "ppo_epochs": 1,
                "rollout": {"n_tasks": 2, "samples": 2, "max_steps": 2},
                "judge": judge,
            },
        },
    )


def test_the_vlm_flywheel_killed_mid_rl_resumes_and_fills_every_table(
    prefect_harness, sites, chromium, tmp_path
):
    from flows.flywheel import flywheel
    from stages.config import config_from_mapping
    from stages.flywheel import FlywheelConfig, Lent

    home = str(tmp_path / "home")
    recipe = tmp_path / "recipe.yaml"  # a user's recipe: the judge it keeps, a short horizon
    text = DEFAULT_RECIPE.replace("horizon: [10, 20]", "horizon: [3]")
    text = text.replace("[programmatic]", "[rubric_vlm]").replace("[1.0, 1.0]", "[0.0, 1.0]")
    recipe.write_text(text)
    # the verdicts before RL iteration 0's last: the expert's 3, the policy's 1 × 2, RL's 2 × 2
    last_of_iteration_0 = 3 + 2 + 4
    with stand_in(hold_verdict=last_of_iteration_0) as fake:
        settings = {**tiny_settings(fake.url), "recipe": str(recipe)}
        cfg = config_from_mapping(FlywheelConfig, settings)
        cfg.check()
        file = tmp_path / "flywheel.yaml"
        file.write_text(yaml.safe_dump(settings))
        env = {**os.environ, "PREFECT_API_URL": prefect_harness, "WEBLOOP_HOME": home}
        env.pop("WEBLOOP_WAREHOUSE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.flywheel", "flywheel", "--config", str(file)],
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        engine = _kill_while_held(proc, fake, home)
        fake.release.set()
        _assert_gone(engine)
        before = _counts(home)
        out = flywheel(cfg, home, Lent(sites, chromium.browser, chromium.run))
        after = _counts(home)
    [r] = out.rounds
    first, second = r.rl.iterations
    # the re-run: iteration 0's rollouts were stored (no server for them), its last verdict
    # and its update were made now; iteration 1's rollouts came from the server it started on
    # iteration 0's checkpoint, then it synced in place and checked parity
    assert first["served_from"] is None and second["served_from"] == first["checkpoint"]
    assert second["steps_run"] > 0 and second["timing"]["parity_max_abs_diff"] < 1e-3
    assert second["timing"]["sync_in_place"] == 1.0
    for table in ("trajectories", "steps", "judgments", "metrics"):
        assert after[table] == after[f"distinct_{table}"], table  # nothing written twice
    assert before["trajectories"] <= after["trajectories"]
    # the killed run had stored RL iteration 0's rollouts; the re-run added iteration 1's only
    assert (before["rl_trajectories"], after["rl_trajectories"]) == (4, 8)
    for table in ("judgments", "step_scores", "interventions", "datasets", "training_runs"):
        assert after[table] > 0, table  # rows in every table
    assert after["evaluations"] == 2  # the untrained VLM and round 1's checkpoint
    assert after["proposers"] == ["openai:teacher"] and after["scorers"] == ["vlm"]
    assert after["policies"] == ["expert", "hf", "intervention:openai:teacher"]
    # the round's policy is RL's checkpoint, evaluated; RL started from the round's SFT
    # checkpoint, anchored by the round's dataset
    assert r.trained.checkpoint == second["checkpoint"]
    assert r.trained.checkpoint_id == r.rl.checkpoint_id != r.sft.checkpoint_id
    assert out.final["checkpoint_id"] == r.trained.checkpoint_id
    assert after["rl_lineage"] == [("rl", r.sft.checkpoint, r.dataset["dataset_id"])]
    assert "| RL | " in r.markdown and "the VLM" in r.markdown
    assert re.search(r"rollout [\d.]+ s, judge [\d.]+ s, update [\d.]+ s", r.markdown)
    # after a sync the server answers as the saved checkpoint does in-process
    served = ServedCheckpoints(engine="hf", reload_root=Path(home) / "checkpoints")
    try:
        url, _ = served.endpoint(first["checkpoint"])
        assert served.sync(second["checkpoint"])[0] == "reload"
        assert greedy_served(url) == greedy_in_process(second["checkpoint"])
    finally:
        served.stop()


FIXED = [{"role": "user", "content": "Task: open the inbox.\nAction:"}]


def greedy_served(base_url: str) -> str:
    body = {"model": "policy", "messages": FIXED, "temperature": 0, "max_tokens": 8}
    r = httpx.post(base_url + "/chat/completions", json=body, timeout=120)
    return r.json()["choices"][0]["message"]["content"]


def greedy_in_process(checkpoint: str) -> str:
    from rollouts.hf import HFGenerator, load_model

    model, proc = load_model(checkpoint)
    return HFGenerator(model, proc).run_batch([FIXED], 8)[0].text


def _kill_while_held(proc: subprocess.Popen, fake: Any, home: str) -> int | None:
    """Once the stand-in holds RL iteration 0's last verdict (the rollouts stored, the model
    server up, no update yet), SIGKILL the flywheel's process group; the server's pid."""
    try:
        while not fake.holding.wait(2):
            if proc.poll() is not None:
                raise AssertionError(f"the flywheel ended: {proc.stderr.read().decode()[-3000:]}")
        engine = _engine_under(home)
        os.killpg(proc.pid, signal.SIGKILL)
        return engine
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)


def _engine_under(home: str) -> int | None:
    """The hf engine serving a checkpoint under ``home`` (its argv names the folder)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serving.server" in argv and any(a.startswith(home.encode()) for a in argv):
            return int(entry.name)
    return None


def _assert_gone(engine: int | None) -> None:
    from serving.supervisor import group_members

    assert engine is not None, "the flywheel's RL started no model server"
    deadline = time.monotonic() + 60
    while group_members(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(engine) == []  # it died with the flywheel (PR_SET_PDEATHSIG)


def _counts(home: str) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""), read_only=True) as wh:

        def one(q: str) -> Any:
            return wh.sql(q).item()

        out = {
            t: one(f"SELECT count(*) FROM {t}")
            for t in (
                "trajectories",
                "steps",
                "judgments",
                "metrics",
                "step_scores",
                "interventions",
                "datasets",
                "training_runs",
                "evaluations",
            )
        }
        out["rl_trajectories"] = one(
            "SELECT count(*) FROM trajectories WHERE starts_with(run_id, 'train-rl-')"
        )
        out["distinct_trajectories"] = one("SELECT count(DISTINCT traj_id) FROM trajectories")
        out["distinct_steps"] = one("SELECT count(DISTINCT (traj_id, step_idx)) FROM steps")
        out["distinct_judgments"] = one(
            "SELECT count(DISTINCT (traj_id, judge, judge_version)) FROM judgments"
        )
        out["distinct_metrics"] = one(
            "SELECT count(DISTINCT (training_run_id, step, name)) FROM metrics"
        )
        out["proposers"] = sorted(wh.sql("SELECT DISTINCT proposer FROM interventions")["proposer"])
        out["scorers"] = sorted(wh.sql("SELECT DISTINCT scorer FROM step_scores")["scorer"])
        out["policies"] = sorted(wh.sql("SELECT DISTINCT policy FROM trajectories")["policy"])
        out["rl_lineage"] = wh.sql(
            "SELECT stage, base_model, dataset_id FROM training_runs WHERE stage = 'rl'"
        ).rows()
        return out
