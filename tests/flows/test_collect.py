"""`webloop collect` end to end: Prefect flow, real Chromium, bundled sites, warehouse; killed
with SIGKILL mid-run and re-run: nothing duplicated, nothing finished lost.

The model behind the collector is a local OpenAI-compatible server that lets exactly
``FINISH_BEFORE_KILL`` trajectories end and holds the next ones at their last step, so the kill
always lands mid-run with a known number of finished trajectories, however fast the machine."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollouts.localserver import ThreadedServer
from sites.tasks import generate
from tests.cli.cli_runner import webloop
from tests.flows.integrity import duplicate_and_mismatched
from tests.rollouts.fake_openai import last_user_text
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]
N_TASKS, FINISH_BEFORE_KILL = 10, 4


class GatedModel:
    """Every trajectory: ``scroll`` first, then ``answer``. Only ``allowed`` answers go out
    until :meth:`release`; later answers wait for it (their trajectories stay in flight)."""

    def __init__(self, allowed: int) -> None:
        self.allowed, self.answered = allowed, 0
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.http = ThreadedServer(
            Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        )
        self.url = self.http.base + "/v1"

    def release(self) -> None:
        self.released.set()

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        if "Previous actions: none" in last_user_text(body):
            content = "Action: scroll(0, 300)"
        else:
            with self.lock:
                turn, self.answered = self.answered, self.answered + 1
            while turn >= self.allowed and not self.released.is_set():
                await asyncio.sleep(0.02)
            content = 'Action: answer("not sure")'
        message = {"role": "assistant", "content": content}
        return JSONResponse({"choices": [{"index": 0, "message": message}]})


def stored(home: Path) -> dict[str, tuple]:
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        rows = wh.sql(
            "SELECT traj_id, status, n_steps, ended_at FROM trajectories WHERE run_id = 'kill-me'"
        )
    return {r[0]: r[1:] for r in rows.iter_rows()}


def wait_until_held(proc: subprocess.Popen, model: GatedModel, home: Path) -> None:
    """Wait (a generous deadline, not a fixed sleep) until the allowed trajectories are stored
    and the next one is held at its answer; the model holds the rest, so the run cannot end
    meanwhile."""
    deadline = time.monotonic() + 300
    before: dict[str, tuple] = {}
    while len(before) < FINISH_BEFORE_KILL or model.answered <= FINISH_BEFORE_KILL:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"stored {len(before)} in 300 s"
        if (home / "lake").exists():
            before = stored(home)
        time.sleep(0.2)


def test_collect_killed_and_rerun_keeps_every_finished_trajectory_once(
    prefect_subprocess_env: dict[str, str], tmp_path: Path
):
    home = tmp_path / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        put_tasks(wh, generate(80, 0))
    model = GatedModel(allowed=FINISH_BEFORE_KILL)
    with model.http:
        cmd = [
            "collect",
            *("--n-tasks", str(N_TASKS), "--concurrency", "2", "--run", "kill-me"),
            *("--policy", "openai", "--base-url", model.url, "--model", "gated"),
        ]
        env = {**prefect_subprocess_env, "WEBLOOP_HOME": str(home), "COLUMNS": "200"}
        env.pop("WEBLOOP_WAREHOUSE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.app", *cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            wait_until_held(proc, model, home)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the collector, its browsers, its sites
            proc.wait(30)
        before = stored(home)
        assert len(before) == FINISH_BEFORE_KILL
        assert {row[0] for row in before.values()} == {"failure"}  # "not sure" is wrong

        model.release()
        out = webloop(home, *cmd).stdout  # in-process, on the session's Prefect server
    assert f"skipped {FINISH_BEFORE_KILL} already stored" in out
    after = stored(home)
    assert len(after) == N_TASKS
    for tid, row in before.items():
        assert after[tid] == row  # kept as it was, not redone
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        whole = duplicate_and_mismatched(wh)
        n_steps = wh.sql("SELECT DISTINCT n_steps FROM trajectories").rows()
        run = wh.sql("SELECT status FROM runs WHERE run_id = 'kill-me'").item()
    assert whole == (0, 0) and run == "completed"
    assert n_steps == [(2,)]  # scroll, answer: every trajectory whole


def test_collect_options_reach_the_environment_and_prompts():
    from stages.collect import CollectConfig, env_config, make_policy_for, prompt_config
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
    cut = dataclasses.replace(cfg, a11y_chars=900, a11y_focus=True)
    assert (make_policy_for(cut).prompt.max_a11y_chars, prompt_config(cut).a11y_focus) == (
        900,
        True,
    )
    # the tree settings join a run's identity only off their defaults: earlier runs keep ids
    assert not {"a11y_chars", "a11y_focus"} & set(cfg.identity())
    assert (cut.identity()["a11y_chars"], cut.identity()["a11y_focus"]) == (900, True)
    # so does the short system prompt; it reaches the policy's prompts, never screenshot-only
    short = dataclasses.replace(cfg, prompt_mode="a11y", system_prompt="short")
    assert "system_prompt" not in cfg.identity()
    assert short.identity()["system_prompt"] == "short"
    assert make_policy_for(short).prompt.system == "short"
    with pytest.raises(WarehouseError, match="a screenshot-only prompt has no refs"):
        prompt_config(dataclasses.replace(short, prompt_mode="screenshot"))
    for bad in (CollectConfig(coords="inches"), CollectConfig(prompt_mode="audio")):
        with pytest.raises(WarehouseError):
            env_config(bad)
            prompt_config(bad)
    with pytest.raises(WarehouseError, match="needs --base-url and --model"):
        make_policy_for(CollectConfig(policy="openai"))
    # how the hf policy chooses joins the identity off its default; it is for hf only
    assert "choose" not in cfg.identity()
    assert CollectConfig(policy="hf", choose="candidates").identity()["choose"] == "candidates"
    with pytest.raises(WarehouseError, match="--choose candidates is for --policy hf"):
        make_policy_for(CollectConfig(policy="ranker", model="x", choose="candidates"))


def test_ctrl_c_stops_collect_promptly_and_a_rerun_redoes_the_episodes_in_flight(
    prefect_harness: str, tmp_path: Path
):
    """A terminal's Ctrl-C (SIGINT to the whole process group: the collector, its Chromium, its
    sites server) with Prefect's temporary server, as a user runs it: the command stops within
    seconds and says what it left; the episodes in flight are not stored (no 0-step 'timeout'
    rows), so the same command runs them again."""
    home = tmp_path / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        put_tasks(wh, generate(80, 0))
    model = GatedModel(allowed=FINISH_BEFORE_KILL)
    run = ["--run", "kill-me"]
    with model.http:
        cmd = [
            "collect",
            *("--n-tasks", str(N_TASKS), "--concurrency", "2", *run),
            *("--policy", "openai", "--base-url", model.url, "--model", "gated"),
        ]
        env = {**os.environ, "WEBLOOP_HOME": str(home), "PREFECT_HOME": str(tmp_path / "pf")}
        for name in ("WEBLOOP_WAREHOUSE", "PREFECT_API_URL"):  # the temporary server
            env.pop(name, None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.app", *cmd],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's foreground job
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            wait_until_held(proc, model, home)
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=120)
            took = time.monotonic() - sent
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err
        assert took < 30, f"Ctrl-C took {took:.0f} s"
        assert (
            f"interrupted: run kill-me stopped; {FINISH_BEFORE_KILL} finished trajectories stored"
        ) in err and "re-run the same command" in err, err
        assert "Traceback" not in err and "events" not in err.lower(), err
        after_stop = stored(home)
        assert len(after_stop) == FINISH_BEFORE_KILL  # nothing in flight was stored
        assert {row[0] for row in after_stop.values()} == {"failure"}
        with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
            status = wh.sql("SELECT status FROM runs WHERE run_id = 'kill-me'").item()
        assert status == "cancelled"

        model.release()
        out = webloop(home, *cmd).stdout
    assert f"skipped {FINISH_BEFORE_KILL} already stored" in out
    assert len(stored(home)) == N_TASKS
