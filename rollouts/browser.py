"""Chromium through async Playwright, and the executor that applies grammar actions to a page.

The executor is the one place actions touch a browser: rollouts, the scripted expert and the
exact PRM scorer all go through :func:`execute`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ada_url import URL

from rollouts.actions import (
    Action,
    Answer,
    Back,
    Click,
    Goto,
    Press,
    Scroll,
    Select,
    Target,
    Type,
    Wait,
)

CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # WebRTC sends UDP (STUN, media) past any HTTP proxy, hence past the origin allowlist
    # (rollouts/proxy.py). The policy disable_non_proxied_udp leaves WebRTC only TCP through the
    # proxy. The headless shell reads the first switch, the full browser the second (measured
    # with Chromium 156: each ignores the other's); both are harmless where unknown.
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
]
_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
# Chromium's headless shell (Debian's chromium-headless-shell; what Playwright itself runs for
# headless): the same Blink and V8 without the browser UI layer. Measured here, a context with
# four page loads and screenshots cost its processes 2.5x less CPU than the full browser.
_HEADLESS_SHELLS = ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium-headless-shell")


def chromium_executable(headless: bool = True) -> str | None:
    """The Chromium to launch: ``$WEBLOOP_CHROMIUM``; else, headless, the system's headless
    shell; else the system Chromium (Debian's); else None for Playwright's own build (whose
    headless mode is its own headless shell)."""
    env = os.environ.get("WEBLOOP_CHROMIUM")
    if env:
        return env
    candidates = (_HEADLESS_SHELLS + _CANDIDATES) if headless else _CANDIDATES
    return next((p for p in candidates if Path(p).exists()), None)


ROOT_WARNING = (
    "warning: running as root, so Chromium browses without its sandbox (it cannot sandbox as "
    "root): a page that exploits the renderer runs with root's rights; run webloop as a "
    "non-root user"
)
_warned_root = False


def launch_options(uid: int) -> dict[str, Any]:
    """The sandbox part of ``playwright.chromium.launch``'s keyword arguments for a process
    running as ``uid``: ``chromium_sandbox`` and ``args``.

    Rollout browsers open third-party pages, so Chromium's sandbox stays on (Playwright's
    ``chromium_sandbox=True``: Playwright adds ``--no-sandbox`` unless it is set). The exception
    is root (``uid == 0``), where Chromium refuses to start sandboxed; there the sandbox is off
    (``--no-sandbox``) and :func:`launch` warns once."""
    root = uid == 0
    return {
        "chromium_sandbox": not root,
        "args": (["--no-sandbox"] if root else []) + CHROMIUM_ARGS,
    }


async def launch(playwright: Any, *, headless: bool = True) -> Any:
    """Launch Chromium with the flags this environment needs: the sandbox on unless running as
    root (:func:`launch_options`; as root, a one-time warning on stderr), no network chatter."""
    global _warned_root
    options = launch_options(os.geteuid())
    if not options["chromium_sandbox"] and not _warned_root:
        _warned_root = True
        print(ROOT_WARNING, file=sys.stderr)
    return await playwright.chromium.launch(
        executable_path=chromium_executable(headless), headless=headless, **options
    )


class SharedSlot:
    """A browser slot (the interface :class:`~rollouts.env.BrowserEnv` uses) over a Chromium that
    the caller launched and owns: any number of environments open contexts on it at once, and
    closing the slot leaves the browser running. A crashed shared browser is not relaunched (its
    owner decides); episodes on it end as infrastructure errors."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.served = 0

    async def context(self, **kw: Any) -> Any:
        self.served += 1
        return await self.browser.new_context(**kw)

    async def close(self) -> None:
        """Nothing to do: the owner closes the browser."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one action: the answer (for ``answer``) or an error message (bad target…)."""

    answer: str | None = None
    error: str | None = None


class ActionError(RuntimeError):
    """An action could not be carried out on the page (element missing, not clickable…)."""


def _locator(page: Any, t: Target) -> Any:
    if t.selector is not None:
        return page.locator(t.selector).first
    if t.ref is not None:
        return page.locator(f"aria-ref={t.ref}")
    return page.locator(f'[data-webloop-mark="{t.mark}"]').first


def _point(page: Any, t: Target, coords: str) -> tuple[float, float]:
    x, y = float(t.x), float(t.y)  # type: ignore[arg-type]
    if coords == "norm1000":
        vp = page.viewport_size or {"width": 1280, "height": 800}
        x, y = x / 1000 * vp["width"], y / 1000 * vp["height"]
    return x, y


async def execute(
    page: Any, action: Action, *, coords: str = "pixels", timeout_ms: float = 10_000
) -> ExecResult:
    """Apply ``action`` to ``page``. Failures of the action itself come back as ``error``."""
    from playwright.async_api import Error as PlaywrightError

    try:
        return await _execute(page, action, coords, timeout_ms)
    except (PlaywrightError, ActionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ExecResult(error=first[:300])


async def _execute(page: Any, a: Action, coords: str, timeout_ms: float) -> ExecResult:
    if isinstance(a, Click | Press | Select):  # may start a navigation: wait for it to land
        async with _navigation_settled(page, timeout_ms):
            return await _apply(page, a, coords, timeout_ms)
    return await _apply(page, a, coords, timeout_ms)


NAV_GRACE_S = 0.05  # how long after an action a navigation may take to start


@contextlib.asynccontextmanager
async def _navigation_settled(page: Any, timeout_ms: float):
    """After the body, if a main-frame navigation started, wait until the new page loaded."""
    started, committed = asyncio.Event(), asyncio.Event()

    def on_request(request: Any) -> None:
        if request.is_navigation_request() and request.frame == page.main_frame:
            started.set()
            committed.clear()

    def on_navigated(frame: Any) -> None:
        if frame == page.main_frame:
            committed.set()

    page.on("request", on_request)
    page.on("framenavigated", on_navigated)
    try:
        yield
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.wait(), NAV_GRACE_S)
        if started.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(committed.wait(), timeout_ms / 1000)
            await _settle(page, timeout_ms)
    finally:
        page.remove_listener("request", on_request)
        page.remove_listener("framenavigated", on_navigated)


async def _apply(page: Any, a: Action, coords: str, timeout_ms: float) -> ExecResult:
    match a:
        case Answer(text=text):
            return ExecResult(answer=text)
        case Click(target=t) if t.x is not None:
            x, y = _point(page, t, coords)
            await page.mouse.click(x, y)
        case Click(target=t):
            await _locator(page, t).click(timeout=timeout_ms)
        case Type(text=text, target=None):
            await page.keyboard.type(text)
        case Type(text=text, target=t) if t.x is not None:
            x, y = _point(page, t, coords)  # click into the field, replace its value
            await page.mouse.click(x, y)
            focused = page.locator("*:focus").first
            if await focused.count() and await focused.evaluate(_FILLABLE_JS):
                await focused.fill(text, timeout=timeout_ms)  # like a ref or mark target
            else:
                await page.keyboard.type(text)
        case Type(text=text, target=t):
            await _locator(page, t).fill(text, timeout=timeout_ms)
        case Press(key=key):
            await page.keyboard.press(key)
        case Scroll(dx=dx, dy=dy, target=None):
            await page.mouse.wheel(dx, dy)
            await _scroll_settled(page)
        case Scroll(dx=dx, dy=dy, target=t):
            if t.x is not None:
                await page.mouse.move(*_point(page, t, coords))
            else:
                await _locator(page, t).hover(timeout=timeout_ms)
            await page.mouse.wheel(dx, dy)
            await _scroll_settled(page)
        case Select(target=t, value=value):
            loc = await _select_at(page, _point(page, t, coords)) if t.x is not None else None
            loc = loc or _locator(page, t)
            try:
                await loc.select_option(label=value, timeout=timeout_ms)
            except Exception:
                await loc.select_option(value=value, timeout=timeout_ms)
        case Goto(url=url):
            await page.goto(goto_url(url), timeout=timeout_ms)
        case Back():
            await page.go_back(timeout=timeout_ms)
        case Wait(seconds=s):
            await asyncio.sleep(min(float(s), 30.0))
        case _:
            raise ActionError(f"unsupported action {a!r}")
    await _settle(page, timeout_ms)
    return ExecResult()


GOTO_SCHEMES = ("http:", "https:")


def goto_url(url: str) -> str:
    """The URL a ``goto`` opens: ``url`` parsed the way the browser parses it (the WHATWG
    standard, through ``ada_url``: case, surrounding spaces, tabs and newlines hide nothing)
    and serialised. Anything but an absolute http(s) URL is an :class:`ActionError` (an action
    error on the step; the episode goes on): ``file:`` reads the machine's files,
    ``chrome:`` the browser's internals, ``javascript:`` and ``data:`` run script outside the
    origin allowlist's view."""
    shown = url if len(url) <= 80 else url[:77] + "..."
    try:
        parsed = URL(url)
    except ValueError:
        raise ActionError(f"goto needs an absolute http or https URL, not {shown!r}") from None
    if parsed.protocol not in GOTO_SCHEMES:
        raise ActionError(f"goto refuses {parsed.protocol} URLs (only http and https): {shown!r}")
    return parsed.href


async def _settle(page: Any, timeout_ms: float) -> None:
    """Let a navigation the action started finish loading (no-op when none did)."""
    # A slow page is observed as it is; the next action may wait again.
    with contextlib.suppress(Exception):
        await page.wait_for_load_state("load", timeout=timeout_ms)


_FILLABLE_JS = (
    'e => e.matches(\'textarea, [contenteditable=""], [contenteditable=true], '
    "input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit])')"
)

_SELECT_AT_JS = """
([x, y]) => {
  const hit = document.elementFromPoint(x, y);
  const el = hit && (hit.closest('select') || (hit.control && hit.control.tagName === 'SELECT'
    ? hit.control : null));
  if (!el) return false;
  document.querySelectorAll('[data-webloop-select-at]').forEach(
    e => e.removeAttribute('data-webloop-select-at'));
  el.setAttribute('data-webloop-select-at', '1');
  return true;
}
"""


async def _select_at(page: Any, point: tuple[float, float]) -> Any:
    """The ``<select>`` at a point (``select(x, y, "Red")``); an action error when there is
    none."""
    if not await page.evaluate(_SELECT_AT_JS, list(point)):
        raise ActionError(f"no <select> at ({point[0]:g}, {point[1]:g})")
    return page.locator("[data-webloop-select-at]").first


_SCROLL_SETTLED_JS = """
async () => {
  let last = null, same = 0;
  for (let i = 0; i < 40 && same < 3; i++) {
    await new Promise(r => requestAnimationFrame(r));
    const now = scrollX + ',' + scrollY;
    same = now === last ? same + 1 : 0;
    last = now;
  }
}
"""


async def _scroll_settled(page: Any) -> None:
    """Wait until a wheel scroll has come to rest (Playwright's wheel returns before it did), so
    the next observation shows where the page ended up."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(page.evaluate(_SCROLL_SETTLED_JS), 2.0)
