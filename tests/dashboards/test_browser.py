"""The app for real: ``webloop dashboard``'s ``streamlit run`` command on a free port, the
trajectory page in headless Chromium (Playwright): the screenshot with the action marker is
there, the answer holding HTML/JS shows as text and no script runs, and a label saved through
the UI is in the warehouse. Set WEBLOOP_DOCS_SCREENSHOT=docs/dashboard.png to keep the page's
screenshot for the README."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from cli.dashboard import dashboard_command
from dashboards.marker import MARKER
from tests.conftest import free_port
from tests.dashboards.fixture import ANSWER, INSTRUCTION
from warehouse import Warehouse, WarehouseConfig

pytestmark = pytest.mark.browser
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def served(dash_home: Path, tmp_path_factory) -> Iterator[str]:
    """``streamlit run dashboards/app.py`` (the command ``webloop dashboard`` runs) on the
    fixture warehouse; its URL."""
    port = free_port()
    argv, env = dashboard_command(port, home=dash_home)
    env["WEBLOOP_WAREHOUSE"] = ""
    log_path = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(f"{url}/_stcore/health", timeout=2).text == "ok":
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"streamlit did not start: {log.read()[-3000:]}")
                time.sleep(0.3)
            yield f"{url}?token={env['WEBLOOP_DASHBOARD_TOKEN']}"  # what the command prints
        finally:
            proc.terminate()
            proc.wait(30)


def marker_pixels(png: bytes, x: int, y: int, r: int = 20) -> int:
    """How many pixels of (about) the marker colour lie within r of (x, y)."""
    img = Image.open(io.BytesIO(png)).convert("RGB")
    return sum(
        max(abs(a - b) for a, b in zip(img.getpixel((i, j)), MARKER, strict=True)) < 40
        for i in range(max(0, x - r), min(img.width, x + r))
        for j in range(max(0, y - r), min(img.height, y + r))
    )


def test_trajectory_page_in_chromium(served: str, dash_home: Path, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            page.set_default_timeout(180_000)  # a loaded machine renders slowly
            base, token = served.split("?")
            page.goto(f"{base}/trajectories?traj=tx-html&step=0")  # no token: nothing shown
            page.get_by_text("needs its access token").wait_for(timeout=180_000)
            assert page.get_by_text("Drawn: click at").count() == 0
            page.goto(f"{base}/trajectories?traj=tx-html&step=0&{token}")
            page.get_by_text("Drawn: click at (100, 60)").wait_for(timeout=180_000)

            # the screenshot, with the click marker drawn at (100, 60)
            img = page.locator("img[src*='/media/']").first
            img.wait_for(timeout=180_000)
            src = img.get_attribute("src")
            png = page.request.get(src if src.startswith("http") else base + src).body()
            assert Image.open(io.BytesIO(png)).size == (320, 200)
            assert marker_pixels(png, 100, 60) > 20
            assert marker_pixels(png, 250, 150) == 0

            # untrusted page content is text: the script tags are visible, none ran. The
            # blocks render after the screenshot on a loaded machine: wait for them, as for it
            # (all_inner_texts does not wait; it read an empty page under load 15 once)
            page.locator("code", has_text=ANSWER).first.wait_for(timeout=180_000)
            page.locator("code", has_text=INSTRUCTION).first.wait_for(timeout=180_000)
            codes = page.locator("code").all_inner_texts()
            assert any(ANSWER in c for c in codes), codes
            assert any(INSTRUCTION in c for c in codes)
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert not page.evaluate(
                "[...document.scripts].some(s => s.textContent.includes('__pwned'))"
            )
            assert page.locator("img[src='x']").count() == 0

            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=False)
            keep = os.environ.get("WEBLOOP_DOCS_SCREENSHOT")
            if keep:
                shutil.copyfile(shot, keep)

            # a label saved through the UI lands in human_labels
            # (success: tx-html stays out of the disagreement lists other tests count)
            form = page.locator('[data-testid="stForm"]')
            form.get_by_text("success", exact=True).click()
            form.get_by_label("Note").fill("checked in the browser")
            form.get_by_label("Reviewer").fill("browser-bob")
            form.get_by_role("button", name="Save label").click()
            page.get_by_text("Saved: success by browser-bob").wait_for(timeout=180_000)
            assert page.evaluate("typeof window.__pwned") == "undefined"
        finally:
            browser.close()
    cfg = WarehouseConfig.from_env(home=dash_home, warehouse="")
    with Warehouse.open(cfg, migrate=False, read_only=True) as wh:
        rows = wh.sql(
            "SELECT label, step_idx, note, source FROM human_labels WHERE traj_id = ? "
            "AND reviewer = ?",
            ["tx-html", "browser-bob"],
        ).rows()
    assert rows == [("success", None, "checked in the browser", "dashboard")]
