"""The weight-reload endpoint (dev mode) against the requests an attacker can make: a web page in
the user's browser (a ``text/plain`` POST, an ``Origin``), a DNS-rebinding page (another
``Host``), a caller with the token but a folder outside the reload root. Each is refused and the
served model answers as before; the supervisor's own reloads (RL's weight sync) still work.

One hf server in dev mode for the module, started the way RL starts it
(:class:`stages.served.ServedCheckpoints`), over checkpoint ``a``; ``b`` (other weights) lies in
the same reload root, so only the guard stops a forged reload of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import typer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient
from typer.testing import CliRunner

from cli.serving import register
from serving import supervisor as serving
from serving.standalone import devguard
from serving.standalone.devguard import TOKEN_ENV, DevGuard, GuardConfigError
from serving.supervisor import ModelServer, ServerError, ServerSpec, command, group_members
from stages.served import ServedCheckpoints
from tests.serving.vllm_tier import requires_vllm
from warehouse.config import ConfigError

ASK = {"model": "policy", "messages": [{"role": "user", "content": "Action:"}], "max_tokens": 6}
TOKEN = "t" * 43


@dataclass(frozen=True)
class Checkpoints:
    root: Path  # the reload root: a, b and a link leaving it
    a: Path
    b: Path
    elsewhere: Path  # a checkpoint outside the root


@dataclass
class Served:
    served: ServedCheckpoints
    before: str  # a's reply to ASK

    @property
    def server(self) -> ModelServer:
        assert self.served.server is not None
        return self.served.server

    @property
    def rpc(self) -> str:
        return self.server.base_url.removesuffix("/v1") + "/collective_rpc"


def reply(server: ModelServer) -> str:
    r = httpx.post(server.base_url + "/chat/completions", json=ASK, timeout=300)
    return r.json()["choices"][0]["message"]["content"]


def reload_body(path: Path | str, **extra: object) -> str:
    return json.dumps({"method": "reload_weights", "kwargs": {"weights_path": str(path)}, **extra})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> Checkpoints:
    from training.models import build_tiny_idefics

    base = tmp_path_factory.mktemp("reload")
    root = base / "checkpoints"
    a = build_tiny_idefics(root / "a")
    b = build_tiny_idefics(root / "b", seed=1)
    elsewhere = Path(shutil.copytree(b, base / "elsewhere"))
    (root / "link").symlink_to(elsewhere, target_is_directory=True)
    return Checkpoints(root, a, b, elsewhere)


@pytest.fixture(scope="module")
def dev(ckpts, tmp_path_factory) -> Served:
    """RL's server of checkpoint ``a`` (dev mode, reload root: the checkpoints folder)."""
    logs = tmp_path_factory.mktemp("reload-logs")
    served = ServedCheckpoints(
        engine="hf", log_dir=logs, reload_root=ckpts.root, start_timeout_s=1800
    )
    served.endpoint(str(ckpts.a))
    try:
        yield Served(served, reply(served.server))
    finally:
        served.server.stop()


FORGED = [  # a reload of b (inside the root, other weights) and what stops it
    ("a page's text/plain form, no token", 401),
    ("a wrong token", 401),
    ("the token without its scheme", 401),
    ("the token, text/plain", 415),
    ("the token, a cross-origin page", 403),
    ("the token, the server's own origin", 403),
    ("the token, a DNS-rebinding page's Host", 403),
    ("a DNS-rebinding page, no token", 403),
]


def forged_headers(case: str, server: ModelServer) -> dict[str, str]:
    port, kind = server.spec.port, {"Content-Type": "application/json"}
    auth = server.reload_headers()
    token = auth["Authorization"].removeprefix("Bearer ")
    return {
        "a page's text/plain form, no token": {"Content-Type": "text/plain"},
        "a wrong token": {**kind, "Authorization": f"Bearer {TOKEN}"},
        "the token without its scheme": {**kind, "Authorization": token},
        "the token, text/plain": {**auth, "Content-Type": "text/plain"},
        "the token, a cross-origin page": {**kind, **auth, "Origin": "http://evil.example"},
        "the token, the server's own origin": {
            **kind,
            **auth,
            "Origin": f"http://127.0.0.1:{port}",
        },
        "the token, a DNS-rebinding page's Host": {**kind, **auth, "Host": f"evil.example:{port}"},
        "a DNS-rebinding page, no token": {
            "Content-Type": "text/plain",
            "Host": f"evil.example:{port}",
            "Origin": f"http://evil.example:{port}",
        },
    }[case]


@pytest.mark.slow  # one hf server for the module
@pytest.mark.parametrize(("case", "status"), FORGED, ids=[c for c, _ in FORGED])
def test_a_forged_reload_is_refused_and_changes_nothing(case, status, dev, ckpts):
    headers = forged_headers(case, dev.server)
    r = httpx.post(dev.rpc, content=reload_body(ckpts.b), headers=headers, timeout=60)
    assert r.status_code == status, r.text
    assert reply(dev.server) == dev.before  # still a's weights
    assert dev.served.serving == str(ckpts.a)


OUTSIDE = [  # a reload call with the token, and what stops it
    ("a folder outside the root", 403),
    ("a path climbing out of the root", 403),
    ("a link inside the root leading out", 403),
    ("a relative path", 400),
    ("another worker method", 403),
    ("another argument", 403),
]


def outside_body(case: str, ckpts: Checkpoints) -> str:
    return {
        "a folder outside the root": reload_body(ckpts.elsewhere),
        "a path climbing out of the root": reload_body(f"{ckpts.root}/../elsewhere"),
        "a link inside the root leading out": reload_body(ckpts.root / "link"),
        "a relative path": reload_body("checkpoints/b"),
        "another worker method": json.dumps(
            {"method": "save_sharded_state", "kwargs": {"path": str(ckpts.root)}}
        ),
        "another argument": json.dumps(
            {"method": "reload_weights", "kwargs": {"weights_path": str(ckpts.b), "x": "1"}}
        ),
    }[case]


@pytest.mark.slow  # one hf server for the module
@pytest.mark.parametrize(("case", "status"), OUTSIDE, ids=[c for c, _ in OUTSIDE])
def test_the_token_reloads_only_from_inside_the_root(case, status, dev, ckpts):
    headers = {"Content-Type": "application/json", **dev.server.reload_headers()}
    r = httpx.post(dev.rpc, content=outside_body(case, ckpts), headers=headers, timeout=60)
    assert r.status_code == status, r.text
    assert reply(dev.server) == dev.before
    assert dev.served.serving == str(ckpts.a)


@pytest.mark.slow  # one hf server for the module
def test_rl_weight_sync_reloads_in_place_and_restarts_for_a_checkpoint_outside_the_root(dev, ckpts):
    """The supervisor's own reloads pass the guard (RL's weight sync); a checkpoint outside the
    root is served by a restart, which draws a new token: the old launch's no longer works."""
    served, pgid = dev.served, dev.server.pgid
    how, took = served.sync(str(ckpts.b))
    assert (how, dev.server.pgid, served.serving) == ("reload", pgid, str(ckpts.b)) and took > 0
    after = reply(dev.server)
    assert after != dev.before
    old = dev.server.reload_headers()
    how, _ = served.sync(str(ckpts.elsewhere))  # b's weights, outside the root
    assert how == "restart" and dev.server.pgid != pgid and group_members(pgid) == []
    assert reply(dev.server) == after
    stale = {"Content-Type": "application/json", **old}
    r = httpx.post(dev.rpc, content=reload_body(ckpts.a), headers=stale, timeout=60)
    assert r.status_code == 401  # a token dies with its launch
    assert served.sync(str(ckpts.a))[0] == "reload" and reply(dev.server) == dev.before


@pytest.mark.slow  # one hf server for the module
def test_the_token_is_passed_in_the_environment_and_never_logged(dev):
    token = dev.server.reload_headers()["Authorization"].removeprefix("Bearer ")
    assert len(token) >= 32
    pid = dev.server.pgid
    assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert f"{TOKEN_ENV}={token}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert token not in dev.server.log_tail(10**7)
    assert token not in repr(dev.server.spec)


@pytest.mark.slow  # the session's hf server, started as serve-model starts it by default
def test_serve_model_without_dev_mode_has_no_reload_endpoint(hf_server, ckpts, monkeypatch):
    seen = {}
    monkeypatch.setattr(serving, "supervise", lambda spec, **kw: seen.update(spec=spec, **kw) or 0)
    out = CliRunner().invoke(app(), ["serve-model", "--model", str(ckpts.a)])
    assert out.exit_code == 0, out.output
    assert (seen["spec"].dev_mode, seen["token"]) == (False, None)
    assert "--dev-mode" not in command(seen["spec"])[0]
    assert not hf_server.spec.dev_mode
    url = hf_server.base_url.removesuffix("/v1") + "/collective_rpc"
    r = httpx.post(url, content=reload_body(ckpts.b), timeout=60)
    assert r.status_code == 404


def test_dev_mode_off_loopback_is_refused_with_a_message(ckpts, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    args = ["serve-model", "--model", str(ckpts.a), "--dev-mode", "--host", "0.0.0.0"]
    out = CliRunner().invoke(app(), args)
    assert isinstance(out.exception, ConfigError)
    message = str(out.exception)
    assert "loopback only" in message and "'0.0.0.0'" in message and "\n" not in message
    for engine in ("hf", "vllm"):
        with pytest.raises(ServerError, match="loopback only"):
            ServerSpec(engine, str(ckpts.a), host="0.0.0.0", dev_mode=True)
    # the hf engine started directly refuses before it loads anything (the model is missing)
    argv = [sys.executable, "-m", "serving.server", "--model", "/no/model", "--dev-mode"]
    env = {**os.environ, "PYTHONPATH": str(serving.ROOT)}
    run = {"env": env, "cwd": serving.ROOT, "capture_output": True, "text": True, "timeout": 300}
    bound = subprocess.run([*argv, "--host", "0.0.0.0"], **run)
    assert bound.returncode == 2 and "loopback only, not on '0.0.0.0'" in bound.stderr
    env.pop(TOKEN_ENV)
    tokenless = subprocess.run(argv, **run)
    assert tokenless.returncode == 2 and TOKEN_ENV in tokenless.stderr
    with pytest.raises(GuardConfigError, match="loopback only"):  # the guard itself, too
        DevGuard(None, token=TOKEN, host="0.0.0.0:8000", root=str(ckpts.root))


def test_serve_model_dev_mode_needs_a_token_from_the_environment(ckpts, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    seen = {}
    monkeypatch.setattr(serving, "supervise", lambda spec, **kw: seen.update(spec=spec, **kw) or 0)
    out = CliRunner().invoke(app(), ["serve-model", "--model", str(ckpts.a), "--dev-mode"])
    assert isinstance(out.exception, ConfigError) and TOKEN_ENV in str(out.exception)
    assert seen == {}
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    out = CliRunner().invoke(app(), ["serve-model", "--model", str(ckpts.a), "--dev-mode"])
    assert out.exit_code == 0, out.output
    assert (seen["spec"].dev_mode, seen["spec"].reload_root) == (True, str(ckpts.root))
    assert seen["token"] == TOKEN


def test_vllm_gets_the_guard_as_middleware_and_the_token_in_its_environment(ckpts, monkeypatch):
    """vLLM's ``--api-key`` guards ``/v1`` only: dev mode loads the guard as middleware, from a
    folder holding nothing else of webloop, configured by the environment alone."""
    monkeypatch.setattr(serving, "vllm_python", lambda root=serving.ROOT: Path("/v/bin/python"))
    monkeypatch.setenv(TOKEN_ENV, "an-older-launch's-token-" * 2)
    spec = ServerSpec("vllm", str(ckpts.a), port=9001, dev_mode=True)
    argv, env = command(spec, TOKEN)
    assert argv[argv.index("--middleware") + 1] == "devguard.DevGuard"
    assert TOKEN not in " ".join(argv) and env[TOKEN_ENV] == TOKEN
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env[devguard.HOST_ENV] == "127.0.0.1:9001" and env[devguard.ROOT_ENV] == str(ckpts.root)
    [path] = env["PYTHONPATH"].split(os.pathsep)
    assert sorted(p.name for p in Path(path).glob("*.py")) == ["__init__.py", "devguard.py"]
    argv, env = command(ServerSpec("vllm", str(ckpts.a), port=9001))  # no dev mode
    assert "--middleware" not in argv and TOKEN_ENV not in env and "PYTHONPATH" not in env
    assert "VLLM_SERVER_DEV_MODE" not in env


def test_the_guard_built_as_vllm_builds_middleware_guards_every_dev_path(ckpts, monkeypatch):
    """vLLM calls ``app.add_middleware(DevGuard)`` with no arguments: the guard reads the
    environment, leaves the OpenAI and health paths alone and guards every other one."""
    _, env = command(ServerSpec("vllm", str(ckpts.a), port=9001, dev_mode=True), TOKEN)
    for key in (TOKEN_ENV, devguard.HOST_ENV, devguard.ROOT_ENV):
        monkeypatch.setenv(key, env[key])
    got = []

    async def echo(request: Request) -> JSONResponse:
        got.append(await request.body())
        return JSONResponse({"path": request.url.path})

    paths = ["/v1/models", "/health", "/collective_rpc", "/reset_prefix_cache", "/sleep"]
    inner = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in paths])
    inner.add_middleware(DevGuard)
    client = TestClient(inner, base_url="http://127.0.0.1:9001")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/v1/models").status_code == client.get("/health").status_code == 200
    for path in ("/reset_prefix_cache", "/sleep", "/collective_rpc"):
        assert client.post(path, json={}).status_code == 401
    assert client.post("/reset_prefix_cache", json={}, headers=auth).status_code == 200
    assert client.post("/sleep", content="{}", headers=auth).status_code == 415
    link = ckpts.root / "link"
    r = client.post("/collective_rpc", json=json.loads(reload_body(link)), headers=auth)
    assert r.status_code == 403 and got[-1] == b"{}"  # refused before the engine saw it
    inside = ckpts.root / "x" / ".." / "b"
    r = client.post("/collective_rpc", json=json.loads(reload_body(inside)), headers=auth)
    assert r.status_code == 200
    call = {"method": "reload_weights", "kwargs": {"weights_path": os.path.realpath(ckpts.b)}}
    assert json.loads(got[-1]) == call  # the engine loads the folder that was checked
    with pytest.raises(GuardConfigError, match="filesystem root"):
        DevGuard(None, token=TOKEN, host="127.0.0.1:1", root="/")


@pytest.mark.vllm
@requires_vllm
@pytest.mark.timeout(2400)  # its first test also starts vLLM
def test_vllm_refuses_forged_reloads(vllm_server, tmp_path):
    """The session's vLLM (dev mode): its dev endpoints refuse what the hf engine refuses, and
    it answers as before."""
    from training.models import build_tiny_idefics

    def greedy() -> str:
        ask = {**ASK, "model": vllm_server.spec.served_name, "temperature": 0}
        r = httpx.post(vllm_server.base_url + "/chat/completions", json=ask, timeout=300)
        return r.json()["choices"][0]["message"]["content"]

    before, port = greedy(), vllm_server.spec.port
    rpc = vllm_server.base_url.removesuffix("/v1") + "/collective_rpc"
    other = reload_body(build_tiny_idefics(tmp_path / "other", seed=1))  # inside its root
    auth = {"Content-Type": "application/json", **vllm_server.reload_headers()}
    for body, headers, status in [
        (other, {"Content-Type": "text/plain"}, 401),
        (other, {**auth, "Origin": "http://evil.example"}, 403),
        (other, {**auth, "Host": f"evil.example:{port}"}, 403),
        (json.dumps({"method": "execute_model", "kwargs": {}}), auth, 403),
        (reload_body("/"), auth, 403),
    ]:
        assert httpx.post(rpc, content=body, headers=headers, timeout=60).status_code == status
    reset = rpc.replace("/collective_rpc", "/reset_prefix_cache")
    assert httpx.post(reset, timeout=60).status_code == 401
    assert greedy() == before


def app() -> typer.Typer:
    out = typer.Typer()
    out.callback()(lambda: None)
    register(out)
    return out
