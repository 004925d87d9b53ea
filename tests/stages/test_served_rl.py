"""On-policy RL of a VLM rolled out by a served model: the tiny offline Idefics3 behind webloop's
``hf`` engine (``serve-model``), rewarded by a rubric judge on a local OpenAI-protocol server (a
stand-in for a paid judge model: its verdicts alternate per task, so every group has a learning
signal), updated in the trainer, its weights synced into the running server after each update
with a log-prob parity check; then the same run killed mid-way and resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from stages.config import config_from_mapping
from stages.served import ServedCheckpoints
from stages.train import RLConfig, run_rl
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from warehouse import Warehouse
from warehouse.config import WarehouseConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
FIXED = [{"role": "user", "content": "Task: open the inbox.\nAction:"}]


@pytest.fixture(scope="module")
def idefics(tmp_path_factory) -> Path:
    from training.models import build_tiny_idefics

    return build_tiny_idefics(tmp_path_factory.mktemp("idefics") / "tiny-idefics")


def home_with_tasks(tmp_path: Path) -> tuple[Path, WarehouseConfig]:
    """A warehouse holding short bundled tasks."""
    from sites.tasks import generate
    from warehouse.tasks import put_tasks

    home = tmp_path / "home"
    cfg = WarehouseConfig.from_env(home=str(home), warehouse="")
    with Warehouse.open(cfg) as wh:
        put_tasks(wh, generate(8, 0, templates=["wiki_fact", "mail_archive", "shop_product_fact"]))
    return home, cfg


def alternating_judge() -> FakeOpenAI:
    """The rubric judge stand-in: success and failure in turn for each task's trajectories."""
    seen: Counter[str] = Counter()

    def verdict(body: dict) -> str:
        text = last_user_text(body)
        if "List the key points" in text:
            return "1. do what the task asks"
        task = re.search(r"Task: (.*)", text)
        seen[task.group(1) if task else ""] += 1
        return json.dumps({"verdict": "success" if seen[task.group(1)] % 2 else "failure"})

    return FakeOpenAI([], default=("fn", verdict))


def rl_settings(model: Path, judge_url: str) -> dict:
    return {
        "policy": str(model),
        "iterations": 2,
        "serve": "hf",
        "lr": 0.05,
        "batch_size": 8,
        "ppo_epochs": 1,
        "rollout": {"n_tasks": 2, "samples": 2, "max_steps": 2, "seed": 3, "concurrency": 4},
        "judge": {
            "judge": "rubric_vlm",
            "base_url": judge_url,
            "model": "rm",
            "selection": "heuristic",
        },
    }


def greedy_served(base_url: str) -> str:
    body = {"model": "policy", "messages": FIXED, "temperature": 0, "max_tokens": 8}
    r = httpx.post(base_url + "/chat/completions", json=body, timeout=120)
    return r.json()["choices"][0]["message"]["content"]


def greedy_in_process(checkpoint: str) -> str:
    from rollouts.hf import HFGenerator, load_model

    model, proc = load_model(checkpoint)
    return HFGenerator(model, proc).run_batch([FIXED], 8)[0].text


def test_rl_served_killed_mid_run_resumes_without_writing_twice(
    idefics, server, chromium, tmp_path
):
    """``webloop train rl`` of the tiny VLM, served by the hf engine, SIGKILLed (its process
    group) once iteration 0 has updated, synced the server and checked parity; the killed run's
    model server (its own process group) dies with it. The re-run writes nothing twice, starts
    its server on iteration 0's checkpoint for iteration 1's rollouts, rewards them with the
    judge's verdicts, updates, syncs in place and finds the server's log-probs equal to the
    trainer's; the server then answers as the saved checkpoint does in-process."""
    home, cfg = home_with_tasks(tmp_path)
    with alternating_judge() as judge:
        settings = rl_settings(idefics, judge.url)
        path = tmp_path / "rl.yaml"
        path.write_text(json.dumps(settings))  # (JSON is YAML)
        env = {**os.environ, "WEBLOOP_HOME": str(home), "WEBLOOP_WAREHOUSE": ""}
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.app", "train", "rl", "--config", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            engine = _kill_after_iteration_0(proc, home)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _assert_gone(engine)
        with Warehouse.open(cfg) as wh:
            before = _counts(wh)
            rl = config_from_mapping(RLConfig, settings)
            out = chromium.run(run_rl(wh, rl, server=server, browser=chromium.browser), timeout=900)
            first, second = out.iterations
            assert first.collect_run and before["trajectories"] >= 4
            # the re-run's server started on the checkpoint iteration 1 rolls out from
            assert first.served_from is None and second.served_from == first.checkpoint
            assert second.steps_run > 0 and second.nonzero_advantage > 0
            assert {"rollout_s", "judge_s", "update_s", "sync_s", "start_s"} <= set(second.timing)
            assert second.timing["sync_in_place"] == 1.0  # the hf engine reloads in place
            assert second.timing["parity_tokens"] > 0
            assert second.timing["parity_max_abs_diff"] < 1e-3
            after = _counts(wh)
            assert after["trajectories"] == 8 and after["distinct_trajectories"] == 8
            assert after["metrics"] == after["distinct_metrics"]
            assert after["judgments"] == after["distinct_judgments"]
            rows = wh.sql(
                "SELECT DISTINCT t.run_id, t.policy, j.verdict FROM trajectories t JOIN judgments "
                "j USING (traj_id) WHERE j.judge = 'rubric_vlm'"
            ).rows()
            runs = {it.collect_run for it in out.iterations}
            assert set(rows) == {(run, "hf", v) for run in runs for v in ("failure", "success")}
            names = set(
                wh.sql(
                    "SELECT DISTINCT name FROM metrics WHERE training_run_id = ?",
                    [out.training_run_id],
                )["name"]
            )
            assert {"rollout_s", "update_s", "sync_s", "parity_max_abs_diff"} <= names
    # after a sync the server answers as the saved checkpoint does in-process
    served = ServedCheckpoints(engine="hf")
    try:
        url, _ = served.endpoint(str(first.checkpoint))
        assert served.sync(str(out.checkpoint))[0] == "reload"
        assert greedy_served(url) == greedy_in_process(str(out.checkpoint))
    finally:
        served.stop()


def _kill_after_iteration_0(proc: subprocess.Popen, home: Path) -> int | None:
    """Wait for iteration 0's log-prob parity line, then SIGKILL the group; the model
    server's process group id (read from the command's children) or None."""
    deadline = time.monotonic() + 600
    seen = []
    engine = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"train rl exited early: {''.join(seen)[-3000:]}")
        seen.append(line)
        if engine is None:
            engine = _engine_of(proc.pid)
        if "rl iteration 1: weights synced" in line:
            os.killpg(proc.pid, signal.SIGKILL)
            return engine
    raise AssertionError(f"no sync in time: {''.join(seen)[-3000:]}")


def _engine_of(pid: int) -> int | None:
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"serving.server" in cmd:
                return int(child)
    return None


def _assert_gone(engine: int | None) -> None:
    from serving.supervisor import group_members

    assert engine is not None, "the RL command started no model server"
    deadline = time.monotonic() + 60
    while group_members(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(engine) == []


def _counts(wh: Warehouse) -> dict[str, int]:
    q = {
        "trajectories": "SELECT count(*) FROM trajectories",
        "distinct_trajectories": "SELECT count(DISTINCT traj_id) FROM trajectories",
        "metrics": "SELECT count(*) FROM metrics",
        "distinct_metrics": "SELECT count(*) FROM (SELECT DISTINCT training_run_id, step, name "
        "FROM metrics)",
        "judgments": "SELECT count(*) FROM judgments",
        "distinct_judgments": "SELECT count(*) FROM (SELECT DISTINCT traj_id, judge FROM "
        "judgments)",
    }
    return {k: int(wh.sql(v).item()) for k, v in q.items()}
