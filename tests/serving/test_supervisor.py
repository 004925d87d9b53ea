"""`webloop serve-model` supervises its engine: health wait, the base URL printed, a clean stop
on SIGTERM / Ctrl-C that leaves no engine process behind (the engine's process group is gone),
clear errors for bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from cli.serving import register
from serving import supervisor as serving
from serving.supervisor import ServerError, ServerSpec, command, free_port, group_members
from warehouse.config import ConfigError

CLI = (
    "import typer; from cli.serving import register\n"
    "app = typer.Typer()\n"
    "@app.callback()\n"
    "def main() -> None: ...\n"
    "register(app); app()\n"
)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def start_cli(model: Path, port: int, log: Path) -> subprocess.Popen:
    args = ["serve-model", "--engine", "hf", "--model", str(model), "--port", str(port)]
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args, "--log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=serving.ROOT,
    )


def wait_for_url(proc: subprocess.Popen, timeout_s: float = 600) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"serve-model exited early: {''.join(seen)}")
        seen.append(line)
        if line.startswith("base URL: "):
            return line.split()[-1]
    raise AssertionError(f"no URL printed: {''.join(seen)}")


@pytest.mark.slow  # a model server process, started and stopped twice
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_model_prints_the_url_and_stops_its_process_group(sig, idefics, tmp_path):
    port = free_port()
    proc = start_cli(idefics, port, tmp_path / "engine.log")
    engine = None
    try:
        url = wait_for_url(proc)
        assert url == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(url + "/models", timeout=30).json()["data"][0]["id"] == str(idefics)
        [engine] = children(proc.pid)  # the engine runs in its own process group
        assert os.getpgid(engine) == engine != os.getpgid(proc.pid)
        assert group_members(engine)
        proc.send_signal(sig)
        assert proc.wait(120) == 0
        assert group_members(engine) == []  # nothing of the engine is left
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/models", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        if engine is not None and group_members(engine):
            os.killpg(engine, signal.SIGKILL)  # a failed check leaves no engine behind
        proc.stdout.close()


@pytest.mark.slow  # a model server process, then another
def test_model_server_restart_serves_the_new_checkpoint(idefics, tmp_path):
    from training.models import build_tiny_idefics

    other = build_tiny_idefics(tmp_path / "other", seed=1)
    spec = ServerSpec("hf", str(idefics), port=free_port(), name="m", dev_mode=True)
    server = serving.ModelServer(spec, log=tmp_path / "log")
    ask = {"model": "m", "messages": [{"role": "user", "content": "Action:"}], "max_tokens": 6}

    def reply() -> str:
        r = httpx.post(server.base_url + "/chat/completions", json=ask, timeout=120)
        return r.json()["choices"][0]["message"]["content"]

    with server.start(timeout_s=600):
        before, pgid = reply(), server.pgid
        took = server.restart(str(other), timeout_s=600)
        assert took > 0 and server.pgid != pgid and group_members(pgid) == []
        assert server.spec.model == str(other) and reply() != before
        # the weight sync of online RL: in place (dev mode), same process, the old weights back
        pgid = server.pgid
        how, took = server.sync_weights(str(idefics), timeout_s=600)
        assert (how, server.pgid, server.spec.model) == ("reload", pgid, str(idefics))
        assert reply() == before
        bad = httpx.post(  # a folder inside the reload root (the model's parent), no model
            server.base_url.removesuffix("/v1") + "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(idefics.parent)}},
            headers=server.reload_headers(),
            timeout=60,
        )
        assert bad.status_code == 400 and "no config.json" in bad.json()["error"]["message"]
        assert reply() == before  # a refused reload changes nothing
    assert not server.alive()


def test_an_engine_does_not_outlive_a_killed_owner(idefics, tmp_path):
    """SIGKILL of the process that started a model server (no Python runs in it) still stops
    the engine: the kernel signals it (PR_SET_PDEATHSIG)."""
    code = (
        "import sys, time; from serving.supervisor import ModelServer, ServerSpec, free_port\n"
        f"s = ModelServer(ServerSpec('hf', {str(idefics)!r}, port=free_port())).launch()\n"
        "print(s.pgid, flush=True); time.sleep(600)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=serving.ROOT
    )
    engine = int(owner.stdout.readline())
    assert group_members(engine)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 60
    while group_members(engine) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_members(engine) == []
    owner.stdout.close()


def test_bad_input_is_refused_clearly(tmp_path, monkeypatch):
    with pytest.raises(ServerError, match="unknown engine 'tgi'"):
        ServerSpec("tgi", "x")
    with pytest.raises(ServerError, match="loopback only"):
        ServerSpec("hf", "x", host="0.0.0.0", dev_mode=True)
    assert ServerSpec("hf", "x", host="0.0.0.0").host == "0.0.0.0"  # dev mode is off by default
    with pytest.raises(ServerError, match=r"no config\.json\) nor a preset \(tiny-idefics, smol"):
        serving.resolve_model(str(tmp_path))
    # a preset whose pretrained weights are missing: the fix named, no half-built folder left
    monkeypatch.setenv("WEBLOOP_SMOLLM2_GGUF", str(tmp_path / "gone.gguf"))
    with pytest.raises(ServerError, match=r"--model smol-idefics: \$WEBLOOP_SMOLLM2_GGUF=.*gone"):
        serving.resolve_model("smol-idefics", tmp_path / "home")
    assert not (tmp_path / "home" / "models").exists() or not any(
        (tmp_path / "home" / "models").iterdir()
    )
    monkeypatch.setattr(serving, "vllm_python", lambda root=serving.ROOT: None)
    with pytest.raises(ServerError, match="make vllm"):
        command(ServerSpec("vllm", str(tmp_path)))
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    runner = CliRunner()
    bad = runner.invoke(app, ["serve-model", "--engine", "tgi", "--model", "x"])
    assert bad.exit_code != 0 and "unknown engine" in bad.output
    missing = runner.invoke(app, ["serve-model", "--model", str(tmp_path / "nope")])
    assert isinstance(missing.exception, ConfigError) and "config.json" in str(missing.exception)


def test_vllm_command_line(monkeypatch, tmp_path):
    monkeypatch.setattr(serving, "vllm_python", lambda root=serving.ROOT: Path("/v/bin/python"))
    argv, env = command(ServerSpec("vllm", "/m", port=9001, name="tiny", kv_cache_gib=2))
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--served-model-name") + 1] == "tiny"
    assert argv[argv.index("--port") + 1] == "9001"
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["HF_HUB_OFFLINE"] == "1"
    assert "PYTHONPATH" not in env
