"""What a rollout browser may do on the machine it runs on: Chromium keeps its sandbox unless it
runs as root, ``goto`` opens only http(s) URLs (any other scheme is an action error and the
episode goes on), and pages cannot download files."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from rollouts import browser as rollouts_browser
from rollouts.actions import parse_action
from rollouts.browser import (
    CHROMIUM_ARGS,
    ROOT_WARNING,
    SharedSlot,
    chromium_executable,
    launch,
    launch_options,
)
from rollouts.env import BrowserEnv, EnvConfig
from rollouts.localserver import ThreadedServer
from sites.tasks import generate
from tests.rollouts.engine_runner import Scripted, run_on_chromium
from warehouse.records import FAILURE, SUCCESS

PAYLOAD = b"webloop-download-payload"


def _page(title: str, body: str = "") -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><title>{title}</title><body>{body}</body>")


@pytest.fixture(scope="module")
def site():
    app = Starlette(
        routes=[
            Route("/", lambda request: _page("start", "<p>the start page</p>")),
            Route("/next", lambda request: _page("next")),
            Route(
                "/dl",
                lambda request: _page("dl", '<a id="dl" href="/file.bin" download>get</a>'),
            ),
            Route(
                "/file.bin",
                lambda request: Response(
                    PAYLOAD,
                    media_type="application/octet-stream",
                    headers={"Content-Disposition": "attachment; filename=file.bin"},
                ),
            ),
        ]
    )
    with ThreadedServer(app) as server:
        yield server.base


# -- the sandbox -------------------------------------------------------------------------------


def test_chromium_keeps_its_sandbox_except_as_root():
    user = launch_options(1000)
    assert user == {"chromium_sandbox": True, "args": CHROMIUM_ARGS}
    assert "--no-sandbox" not in user["args"]
    root = launch_options(0)
    assert root == {"chromium_sandbox": False, "args": ["--no-sandbox", *CHROMIUM_ARGS]}


def test_launch_passes_the_options_of_its_user_and_warns_root_once(monkeypatch, capsys):
    calls: list[dict[str, Any]] = []

    async def record(**kw: Any) -> None:
        calls.append(kw)

    pw = SimpleNamespace(chromium=SimpleNamespace(launch=record))
    monkeypatch.setattr(rollouts_browser, "_warned_root", False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    asyncio.run(launch(pw))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    asyncio.run(launch(pw))
    asyncio.run(launch(pw))
    assert capsys.readouterr().err == ROOT_WARNING + "\n"  # once per process
    assert "non-root user" in ROOT_WARNING
    assert [(c["chromium_sandbox"], "--no-sandbox" in c["args"]) for c in calls] == [
        (True, False),
        (False, True),
        (False, True),
    ]


@pytest.mark.browser
def test_a_real_launch_as_this_user_browses_sandboxed_unless_root(chromium, site):
    """The session's Chromium (launched by :func:`launch` as the user running the tests): its
    browser process's command line has ``--no-sandbox`` only as root, and it opens pages."""

    async def go() -> tuple[list[str], str]:
        cdp = await chromium.browser.new_browser_cdp_session()
        info = await cdp.send("SystemInfo.getProcessInfo")
        pid = next(p["id"] for p in info["processInfo"] if p["type"] == "browser")
        page = await chromium.browser.new_page()
        await page.goto(site + "/")
        title = await page.title()
        await page.close()
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"), title

    cmdline, title = chromium.run(go())
    assert title == "start"
    assert ("--no-sandbox" in cmdline) == (os.geteuid() == 0)


@pytest.mark.browser
def test_the_non_root_options_start_a_sandboxed_chromium_as_a_non_root_user():
    """Chromium started with a non-root user's options (no ``--no-sandbox``) as such a user
    (``nobody`` when the tests run as root): it runs, sandboxed (it exits where it cannot
    sandbox); as root the same options do not start."""
    exe = chromium_executable(headless=True)
    if exe is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("needs a system Chromium (and runuser, as root)")
    profile = Path(tempfile.mkdtemp(prefix="webloop-sandbox-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(profile, "nobody")
        argv = [
            exe,
            "--headless",
            *launch_options(65534)["args"],
            f"--user-data-dir={profile}",
            "--dump-dom",
            "data:text/html,<p>sandboxed</p>",
        ]
        env = {**os.environ, "HOME": str(profile)}
        as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        run = subprocess.run([*as_user, *argv], capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "<p>sandboxed</p>" in run.stdout
        if os.geteuid() == 0:
            as_root = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
            assert as_root.returncode != 0 and "<p>sandboxed</p>" not in as_root.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


# -- goto: http and https only -----------------------------------------------------------------

REFUSED = [
    ("file:///etc/passwd", "file:"),
    (" FILE:///etc/passwd", "file:"),  # the browser trims and lower-cases the scheme
    ("chrome://version", "chrome:"),
    ("javascript:document.title='pwned'", "javascript:"),
    ("jav\tascript:document.title='pwned'", "javascript:"),  # the browser drops tabs
    ("data:text/html,<title>pwned</title>", "data:"),
    ("view-source:http://127.0.0.1/", "view-source:"),
]


async def _episode(chromium: Any, url: str) -> BrowserEnv:
    env = BrowserEnv(SharedSlot(chromium.browser), EnvConfig(screenshots=False, action_timeout_s=5))
    await env.reset(options={"start_url": url, "max_steps": 30})
    return env


@pytest.mark.browser
def test_goto_opens_only_http_and_https_and_the_episode_goes_on(chromium, site):
    async def go() -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
        env = await _episode(chromium, site + "/")
        seen = []
        try:
            for url, _ in [*REFUSED, ("/next", None)]:
                action = parse_action(f"Action: goto({json.dumps(url)})")
                assert action.url == url  # the grammar reads it; the executor refuses it
                obs, _, terminated, truncated, info = await env.step(action)
                seen.append((info["error"], obs.url, obs.title, terminated or truncated))
            obs, *_, info = await env.step(parse_action(f'goto("{site}/next")'))
            return seen, (info["error"], obs.title)
        finally:
            await env.close()

    seen, last = chromium.run(go())
    # the page stayed as it was: nothing opened, no script ran in it (a javascript: URL did,
    # replacing the document; a data: URL opened its own page), the episode went on
    assert [row[1:] for row in seen] == [(site + "/", "start", False)] * len(seen)
    errors = [row[0] for row in seen]
    assert [e.split(")")[0] + ")" for e in errors[:-1]] == [
        f"goto refuses {scheme} URLs (only http and https)" for _, scheme in REFUSED
    ]
    assert errors[-1] == "goto needs an absolute http or https URL, not '/next'"
    assert last == (None, "next")  # http still works


@pytest.mark.browser
def test_a_refused_goto_is_an_action_error_stored_on_the_step(server, chromium):
    """Through the engine: the refused ``goto`` is stored with its action error, the episode
    goes on to its answer."""
    task = generate(1, 0)[0]
    script = ['goto("file:///etc/passwd")', 'answer("done")']
    (done,) = run_on_chromium(chromium, server, Scripted(lambda i: script[i]), [task])
    assert done.trajectory.status in (SUCCESS, FAILURE), done.trajectory.error  # graded
    assert [s.action_text for s in done.steps] == ['goto("file:///etc/passwd")', 'answer("done")']
    assert done.steps[0].action_error.startswith("goto refuses file: URLs (only http and https)")
    assert done.steps[1].action_error is None
    assert not done.trajectory.meta["final_url"].startswith("file:")


# -- downloads ---------------------------------------------------------------------------------


@pytest.mark.browser
def test_a_download_link_writes_no_file(chromium, site):
    async def go() -> tuple[str | None, bytes | None, Any]:
        from playwright.async_api import Error as PlaywrightError

        env = await _episode(chromium, site + "/dl")
        downloads: asyncio.Queue[Any] = asyncio.Queue()
        env.page.on("download", lambda d: downloads.put_nowait(d))
        try:
            *_, info = await env.step(parse_action('click(css="#dl")'))
            download = await asyncio.wait_for(downloads.get(), 10)
            failure = await download.failure()
            try:
                saved: bytes | None = Path(await download.path()).read_bytes()
            except PlaywrightError:
                saved = None
            return failure, saved, info
        finally:
            await env.close()

    failure, saved, info = chromium.run(go())
    assert saved is None  # nothing written (accepted, the file would hold PAYLOAD)
    assert failure  # the browser cancelled it
    assert info["error"] is None  # the click itself is an ordinary step
