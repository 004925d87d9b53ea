"""``webloop deploy``: the three schedules registered on the session's Prefect server and read
back through the client (flow names, cron strings, parameters); ``--dry-run`` contacts nothing;
a served deployment runs ``maintain_warehouse`` when triggered and records the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli import deploy as cli_deploy
from flows import deploy as dep

pytestmark = pytest.mark.prefect


def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def _root() -> None:  # a group, as in the real CLI (so ``deploy`` is a subcommand)
        pass

    cli_deploy.register(a)
    return a


def invoke(home: Path, *args: str):
    env = {"WEBLOOP_HOME": str(home), "WEBLOOP_WAREHOUSE": None, "COLUMNS": "200"}
    return CliRunner().invoke(app(), ["deploy", *args], env=env)


async def read_back(names: set[str]) -> dict[str, dict]:
    """name → flow name, crons, parameters, active flags of the named deployments."""
    from prefect import get_client

    out = {}
    async with get_client() as client:
        for d in await client.read_deployments():
            if d.name not in names:
                continue
            flow = await client.read_flow(d.flow_id)
            out[d.name] = {
                "flow": flow.name,
                "crons": [s.schedule.cron for s in d.schedules],
                "active": [s.active for s in d.schedules],
                "parameters": d.parameters,
                "id": str(d.id),
            }
    return out


def test_register_only_creates_the_three_schedules(prefect_harness, tmp_path: Path):
    home = tmp_path / "home"
    res = invoke(home, "--register-only", "--eval-n", "40", "--maintain-cron", "30 3 * * 6")
    assert res.exit_code == 0, res.output
    assert "registered 3 deployments on http" in res.output
    names = {"judge-backlog", "nightly-eval-ood", "weekly-maintenance"}
    got = asyncio.run(read_back(names))
    assert set(got) == names
    h = str(home.absolute())
    assert got["judge-backlog"]["flow"] == "judge"
    assert got["judge-backlog"]["crons"] == ["0 * * * *"]
    assert got["judge-backlog"]["parameters"] == {"cfg": {"judge": "programmatic"}, "home": h}
    assert got["nightly-eval-ood"]["flow"] == "evaluate_newest"
    assert got["nightly-eval-ood"]["crons"] == ["0 2 * * *"]
    assert got["nightly-eval-ood"]["parameters"] == {"split": "ood", "n": 40, "home": h}
    assert got["weekly-maintenance"]["flow"] == "maintain_warehouse"
    assert got["weekly-maintenance"]["crons"] == ["30 3 * * 6"]
    assert got["weekly-maintenance"]["parameters"] == {"keep_recent_minutes": 60.0, "home": h}
    assert all(all(v["active"]) for v in got.values())

    # registering again updates the same deployments (no duplicates), with the new schedule
    again = invoke(home, "--register-only", "--judge-cron", "15 * * * *")
    assert again.exit_code == 0, again.output
    got2 = asyncio.run(read_back(names))
    assert {k: v["id"] for k, v in got2.items()} == {k: v["id"] for k, v in got.items()}
    assert got2["judge-backlog"]["crons"] == ["15 * * * *"]


def test_the_scheduled_judge_parameters_validate_into_its_config():
    from flows.judge import judge_flow
    from stages.judge import JudgeConfig

    params = dep.schedules("/h")[0].parameters
    cfg = judge_flow.validate_parameters(params)["cfg"]
    assert isinstance(cfg, JudgeConfig) and cfg.judge == "programmatic"


def test_dry_run_prints_and_bad_input_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(dep, "register", lambda items: pytest.fail("--dry-run registered"))
    res = invoke(tmp_path, "--dry-run", "--eval-split", "test")
    assert res.exit_code == 0, res.output
    assert "nightly-eval-test: flow evaluate_newest, cron '0 2 * * *'" in res.output
    assert "weekly-maintenance: flow maintain_warehouse, cron '0 4 * * 0'" in res.output
    bad = invoke(tmp_path, "--dry-run", "--eval-cron", "every night")
    assert bad.exit_code != 0 and "--eval-cron: 'every night' is not a cron expression" in str(
        bad.exception
    )
    monkeypatch.setattr(dep, "api_url", lambda: None)
    nosrv = invoke(tmp_path, "--register-only")
    assert nosrv.exit_code != 0 and "prefect server start" in str(nosrv.exception)


SERVE = """
import typer
from cli import deploy as cli_deploy
app = typer.Typer()
@app.callback()
def _root() -> None:
    pass
cli_deploy.register(app)
app()
"""


# schedules that do not come due while the test runs (only the triggered run executes)
NEVER_DUE = [f"--{k}-cron=0 0 1 1 *" for k in ("judge", "eval", "maintain")]


async def trigger(name: str) -> tuple[str, str]:
    """Start a run of deployment ``name`` and wait for its end; (state, flow run id)."""
    from prefect.deployments import run_deployment

    fr = await run_deployment(name, timeout=240, poll_interval=1)
    return fr.state.type.value, str(fr.id)


@pytest.mark.slow
def test_served_deployment_runs_maintain_warehouse(prefect_subprocess_env, tmp_path: Path):
    home = tmp_path / "served"
    env = {
        **prefect_subprocess_env,
        "WEBLOOP_HOME": str(home),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    }
    env.pop("WEBLOOP_WAREHOUSE", None)
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "deploy", *NEVER_DUE],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # served: the deployment carries this home (an earlier test registered another one)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and served_home() != str(home.absolute()):
            assert proc.poll() is None, log_text(log)
            time.sleep(0.5)
        assert served_home() == str(home.absolute()), log_text(log)
        state, fr_id = asyncio.run(trigger("maintain_warehouse/weekly-maintenance"))
        assert state == "COMPLETED", log_text(log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    from warehouse import Warehouse, WarehouseConfig

    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
        rows = wh.sql("SELECT status, config FROM runs WHERE kind = 'maintain'").rows()
    assert len(rows) == 1 and rows[0][0] == "completed"
    config = json.loads(rows[0][1]) if isinstance(rows[0][1], str) else rows[0][1]
    assert config["flow_run_id"] == fr_id


def served_home() -> str | None:
    got = asyncio.run(read_back({"weekly-maintenance"}))
    return got["weekly-maintenance"]["parameters"].get("home") if got else None


def log_text(f) -> str:
    f.flush()
    return Path(f.name).read_text()
