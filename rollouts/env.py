"""The browser environment: Gymnasium-shaped and async, one fresh browser context per episode.

    env = BrowserEnv(browser_slot, EnvConfig())
    obs, info = await env.reset(seed=0, options={"start_url": url, "allowed_origins": [...]})
    obs, reward, terminated, truncated, info = await env.step(action)
    await env.close()

* ``obs`` (:class:`Observation`): PNG screenshot bytes, the accessibility snapshot
  (``aria_snapshot(mode="ai")``, refs ``[ref=eN]`` usable as ``click(eN)``), URL, title, and —
  with ``set_of_marks`` — the number of marked elements (``click([N])``).
* ``reward``: 0.0 (success is graded when the episode ends, by the site's checker or a judge).
* ``terminated``: the action was ``answer(...)`` (``info["answer"]`` holds it).
* ``truncated``: the step budget is spent.
* ``info``: ``error`` (the action failed on the page), ``answer``, ``blocked`` (off-origin
  requests refused since the last step).

Cookies and storage never leak between episodes: each ``reset`` makes a new context. The
episode's origin allowlist holds in two layers, each recording what it refuses in ``blocked``: a
route handler aborts the requests the page starts (by full URL, before they reach the network),
and the context's proxy (:mod:`rollouts.proxy`: every connection of the context, loopback
included) refuses what a route never sees — a redirect's next hop, WebSocket and WebRTC-over-TCP
tunnels (recorded as ``CONNECT host:port``). WebRTC's UDP is off (Chromium's
``disable_non_proxied_udp``, :data:`rollouts.browser.CHROMIUM_ARGS`). The context refuses
downloads (a link's ``download``, an attachment: cancelled, no file written), and ``goto``
opens only http(s) URLs (:func:`rollouts.browser.goto_url`). A :class:`BrowserSlot`
owns one Chromium and relaunches it when it crashed or has served ``contexts_per_browser``
episodes, so a crash only takes down the episode running in it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from rollouts.actions import Action, Answer, Click, Goto, Press, Select, Type
from rollouts.browser import execute, launch
from rollouts.proxy import AllowlistProxy, Gate, shared_proxy
from warehouse.retry import aretrying


class BrowserCrashed(RuntimeError):
    """The browser or page died under the episode (an infrastructure error, not a failure)."""


RESET_TIMEOUT_S = 30.0  # the least time the start page of an episode gets to load
STARTS_REQUESTS = (Click, Type, Select, Press, Goto)
"""Actions that can make the page send requests (an autocomplete's fetch, a form post): only
after these does an observation wait for the page to settle (see :meth:`BrowserEnv._quiet`)."""
# The page's own count of the fetch / XHR requests it started (an init script in every page):
# an animation frame's round trip can come back before the browser's event for a request the
# page sent in that frame (seen on a loaded machine: the snapshot after typing lacked the
# autocomplete's suggestions), so the page's count says whether to wait for one.
_REQUESTS_JS = """
(() => {
  if (window.__webloopRequests !== undefined) return;
  window.__webloopRequests = 0;
  const fetch0 = window.fetch;
  window.fetch = function (...args) {
    window.__webloopRequests++;
    return fetch0.apply(this, args);
  };
  const send0 = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function (...args) {
    window.__webloopRequests++;
    return send0.apply(this, args);
  };
})();
"""
_COUNT_JS = "() => window.__webloopRequests || 0"
_FRAME_JS = "() => new Promise(r => requestAnimationFrame(() => r(window.__webloopRequests || 0)))"
CATCH_UP_S = 2.0  # how long a request the page says it sent may take to be reported


@dataclass(frozen=True)
class EnvConfig:
    """Environment settings (stored with every run)."""

    viewport_width: int = field(default=1280, metadata={"help": "Viewport width in pixels."})
    viewport_height: int = field(default=800, metadata={"help": "Viewport height in pixels."})
    coords: str = field(default="pixels", metadata={"help": "pixels or norm1000 (Qwen3-VL)."})
    set_of_marks: bool = field(default=False, metadata={"help": "Number interactive elements."})
    a11y: bool = field(default=True, metadata={"help": "Capture the accessibility snapshot."})
    screenshots: bool = field(
        default=True, metadata={"help": "Capture screenshots (off: text-only policies, fast)."}
    )
    action_timeout_s: float = field(default=10.0, metadata={"help": "Per-action page timeout."})
    contexts_per_browser: int = field(default=50, metadata={"help": "Relaunch after N episodes."})


@dataclass(frozen=True)
class Observation:
    step_idx: int
    url: str
    title: str
    screenshot: bytes | None  # None where the environment captures no screenshots
    a11y: str | None = None
    marks: int = 0


_MARKS_JS = """
() => {
  document.querySelectorAll('.__webloop_mark').forEach(e => e.remove());
  const sel = 'a[href], button, input, select, textarea, ' +
    '[role=button], [role=link], [role=option], [onclick]';
  let n = 0;
  for (const el of document.querySelectorAll(sel)) {
    const r = el.getBoundingClientRect();
    if (r.width < 2 || r.height < 2 || r.bottom < 0 || r.top > innerHeight) continue;
    el.setAttribute('data-webloop-mark', String(++n));
    const tag = document.createElement('div');
    tag.className = '__webloop_mark'; tag.textContent = String(n);
    tag.style.cssText = `position:fixed;left:${r.left}px;top:${Math.max(0, r.top - 14)}px;` +
      'background:#e6007e;color:#fff;font:bold 11px sans-serif;padding:0 3px;z-index:2147483647;' +
      'pointer-events:none;border-radius:2px';
    document.body.appendChild(tag);
  }
  return n;
}
"""


class BrowserSlot:
    """One Chromium, relaunched on crash or after ``contexts_per_browser`` episodes."""

    def __init__(self, playwright: Any, contexts_per_browser: int = 50) -> None:
        self.playwright = playwright
        self.limit = contexts_per_browser
        self.browser: Any = None
        self.served = 0
        self.launches = 0

    async def context(self, **kw: Any) -> Any:
        if self.browser is None or not self.browser.is_connected() or self.served >= self.limit:
            await self.close()
            self.browser = await launch(self.playwright)
            self.launches += 1
            self.served = 0
        self.served += 1
        return await self.browser.new_context(**kw)

    async def pid(self) -> int | None:
        """The browser process id (for crash tests and diagnostics)."""
        if self.browser is None:
            return None
        cdp = await self.browser.new_browser_cdp_session()
        info = await cdp.send("SystemInfo.getProcessInfo")
        return next((p["id"] for p in info["processInfo"] if p["type"] == "browser"), None)

    async def close(self) -> None:
        if self.browser is not None:
            with contextlib.suppress(Exception):
                await self.browser.close()
            self.browser = None


# ``Math.random`` of every page of a seeded episode: mulberry32 (a small, well-mixed 32-bit
# generator) from the episode's seed, installed before any page script runs
_SEEDED_RANDOM_JS = """
(() => {
  let a = %d >>> 0;
  Math.random = function () {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
})();
"""


def origin_of(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"


class BrowserEnv:
    """A Gymnasium-shaped async environment over one :class:`BrowserSlot` (or any slot with an
    async ``context(**kw)``: each episode's context gets ``proxy=`` from the env). ``proxy``: the
    allowlisting proxy the episodes go through (default: the process's :func:`shared_proxy`)."""

    def __init__(
        self,
        slot: BrowserSlot,
        config: EnvConfig | None = None,
        *,
        proxy: AllowlistProxy | None = None,
    ) -> None:
        self.slot = slot
        self.config = config or EnvConfig()
        self.proxy = proxy
        self.gate: Gate | None = None  # this episode's door through the proxy
        self.context: Any = None
        self.page: Any = None
        self.allowed: set[str] = set()
        self.blocked: list[str] = []
        self.step_idx = 0
        self._pending: dict[Any, int] = {}  # the page's requests in flight → their number
        self._started = 0  # requests the page has started (numbers them)
        self._ended = asyncio.Event()  # set whenever a request finishes or fails
        self.max_steps = 0

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start an episode in a fresh context (Gymnasium's signature): ``(obs, info)``.

        ``options``: ``start_url`` (required), ``allowed_origins`` (besides the start URL's own
        origin) and ``max_steps`` (the step budget, default 30). ``seed``: the page's
        ``Math.random`` becomes a generator seeded with it (every page of the episode), so a
        page that draws random numbers draws the same ones again; None leaves the browser's.
        ``info``: ``start_url`` and ``allowed_origins`` as the episode uses them."""
        opts = dict(options or {})
        start_url = opts.pop("start_url", None)
        if not start_url:
            raise ValueError("reset(options={'start_url': ...}) needs the start URL")
        allowed_origins = opts.pop("allowed_origins", None) or []
        max_steps = opts.pop("max_steps", 30)
        if opts:
            raise ValueError(f"reset: unknown options {sorted(opts)}")
        await self.close()
        self.allowed = {origin_of(start_url), *(origin_of(o) for o in allowed_origins)}
        self.blocked, self.step_idx, self.max_steps = [], 0, max_steps
        try:
            # the proxy appends refusals from its own thread, straight into this episode's list
            self.gate = await (self.proxy or shared_proxy()).open(self.allowed, self.blocked.append)
            self.context = await self.slot.context(
                viewport={
                    "width": self.config.viewport_width,
                    "height": self.config.viewport_height,
                },
                proxy=self.gate.playwright_proxy(),
                accept_downloads=False,  # a page cannot write files on this machine
            )
            await self.context.route("**/*", self._route)
            await self.context.add_init_script(_REQUESTS_JS)
            if seed is not None:
                await self.context.add_init_script(_SEEDED_RANDOM_JS % (seed & 0xFFFFFFFF))
            self.page = await self.context.new_page()
            self._track_requests(self.page)
            # opening the start page is set-up, not an action: a short action timeout (local
            # sites answer in milliseconds) must not turn a slow first load into an infra error
            timeout_s = max(self.config.action_timeout_s, RESET_TIMEOUT_S)
            await self.page.goto(start_url, timeout=timeout_s * 1000)
            obs = await self.observe()
        except Exception as exc:
            raise BrowserCrashed(f"reset failed: {exc}") from exc
        return obs, {"start_url": start_url, "allowed_origins": sorted(self.allowed)}

    async def _route(self, route: Any) -> None:
        """The allowlist's first layer: aborts a request the page starts to another origin
        before it reaches the network, recorded by its full URL (the proxy refuses it too, but
        sees an https request only as ``CONNECT host:port``), and fails it as
        ``net::ERR_BLOCKED_BY_CLIENT``. Redirect hops and sockets bypass routes: the proxy's."""
        url = route.request.url
        if url.startswith(("data:", "blob:", "about:")) or origin_of(url) in self.allowed:
            await route.continue_()
        else:
            self.blocked.append(url)
            await route.abort("blockedbyclient")

    async def step(
        self, action: Action, *, timeout_s: float | None = None
    ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        """Apply ``action`` (Gymnasium's signature): ``(obs, reward, terminated, truncated,
        info)``. ``reward`` is 0.0: success is graded when the episode ends, by the site's
        checker or a judge (the environment does not know the site's state). ``info``:
        ``error`` (the action's failure, or None), ``answer`` and ``blocked`` (requests the
        origin allowlist refused). ``timeout_s``: this action's timeout instead of the
        config's (a replay gives an action that failed when recorded a short one)."""
        terminated, truncated, info = await self.act(action, timeout_s=timeout_s)
        return await self.observe(), 0.0, terminated, truncated, info

    async def act(
        self, action: Action, *, timeout_s: float | None = None
    ) -> tuple[bool, bool, dict[str, Any]]:
        """:meth:`step` without the observation: ``(terminated, truncated, info)``. For replays
        that only need to reach a state (a process-reward replay's prefix and continuation):
        the accessibility snapshot is about a quarter of a step's time."""
        if self.page is None:
            raise RuntimeError("step() before reset()")
        blocked_before = len(self.blocked)
        started_before = self._started
        self._check_alive()
        sends = isinstance(action, STARTS_REQUESTS)
        page_before = await self._page_requests() if sends else None
        result = await execute(
            self.page,
            action,
            coords=self.config.coords,
            timeout_ms=(self.config.action_timeout_s if timeout_s is None else timeout_s) * 1000,
        )
        self._check_alive()
        if sends:
            await self._quiet(started_before, page_before)
        terminated = isinstance(action, Answer)
        self.step_idx += 1
        truncated = not terminated and self.step_idx >= self.max_steps
        info = {
            "error": result.error,
            "answer": result.answer,
            "blocked": self.blocked[blocked_before:],
        }
        return terminated, truncated, info

    def _track_requests(self, page: Any) -> None:
        """Number the page's requests and keep those in flight (see :meth:`_quiet`)."""
        self._pending, self._started, self._ended = {}, 0, asyncio.Event()

        def started(req: Any) -> None:
            self._started += 1
            self._pending[req] = self._started
            self._ended.set()  # (also wakes a wait for a request to be reported)

        def ended(req: Any) -> None:
            self._pending.pop(req, None)
            self._ended.set()

        page.on("request", started)
        page.on("requestfinished", ended)
        page.on("requestfailed", ended)

    def _in_flight_since(self, started_before: int) -> bool:
        """Whether a request numbered after ``started_before`` is still in flight."""
        return any(n > started_before for n in self._pending.values())

    async def _quiet(self, started_before: int, page_before: int | None = None) -> None:
        """Let what an action started in the page settle before it is observed: one animation
        frame (the page's handlers have run and sent their requests), then the requests started
        since ``started_before`` (an autocomplete's fetch) finish — bounded by the action
        timeout — and, if the action sent any, one more frame to render their results. Without it
        a snapshot taken right after typing misses the suggestions the next action must click.
        Requests that were in flight before the action are not waited for. ``page_before``: the
        page's own request count before the action; when the frame says the page sent requests
        the browser has not reported yet, they are waited for (:data:`CATCH_UP_S`)."""
        page_now = await self._next_frame()
        loop = asyncio.get_running_loop()
        if self._started == started_before:
            sent = page_now is not None and page_before is not None and page_now > page_before
            if not sent:
                return  # the action sent no request: nothing to wait for or render
            await self._reported(started_before + 1, loop.time() + CATCH_UP_S)
        deadline = loop.time() + self.config.action_timeout_s
        while self._in_flight_since(started_before):
            left = deadline - loop.time()
            if left <= 0:
                break  # a request that never ends: observe the page as it is
            self._ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), left)
        await self._next_frame()

    async def _reported(self, n: int, deadline: float) -> None:
        """Wait (until ``deadline``) until the browser has reported ``n`` requests of the page."""
        loop = asyncio.get_running_loop()
        while self._started < n and (left := deadline - loop.time()) > 0:
            self._ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), left)

    async def _next_frame(self) -> int | None:
        """One animation frame of the page; the page's request count then (None: no answer)."""
        with contextlib.suppress(Exception):
            return int(await asyncio.wait_for(self.page.evaluate(_FRAME_JS), 0.5))
        return None

    async def _page_requests(self) -> int | None:
        """The page's own count of the requests it started (None: no answer)."""
        with contextlib.suppress(Exception):
            return int(await asyncio.wait_for(self.page.evaluate(_COUNT_JS), 0.5))
        return None

    def _check_alive(self) -> None:
        if self.page.is_closed() or not self.slot.browser or not self.slot.browser.is_connected():
            raise BrowserCrashed("the browser or page is gone")

    async def observe(self) -> Observation:
        try:
            marks = 0
            if self.config.set_of_marks:
                marks = await self.page.evaluate(_MARKS_JS)
            shot = await self._screenshot() if self.config.screenshots else None
            tree = await self.page.aria_snapshot(mode="ai") if self.config.a11y else None
            return Observation(
                self.step_idx, self.page.url, await self.page.title(), shot, tree, marks
            )
        except Exception as exc:
            if self.page.is_closed() or not self.slot.browser.is_connected():
                raise BrowserCrashed(f"observation failed: {exc}") from exc
            raise

    async def _screenshot(self) -> bytes:
        """A PNG of the page. Right after a failed navigation Chromium is still swapping in its
        error page and can refuse a capture once; wait for it to load and try again."""

        async def settle() -> None:
            with contextlib.suppress(Exception):
                await self.page.wait_for_load_state("load", timeout=5000)

        policy = aretrying(
            attempts=3,
            retry_on=lambda e: isinstance(e, Exception) and not self.page.is_closed(),
            base_delay=0.2,
            factor=1.0,
            on_retry=settle,
        )
        return await policy(self.page.screenshot, type="png")

    async def cookies(self, url: str) -> list[dict[str, Any]]:
        return await self.context.cookies(url)

    async def close(self) -> None:
        """End the episode: close its context, then its gate (port and connections)."""
        if self.context is not None:
            with contextlib.suppress(Exception):
                await self.context.close()
        if self.gate is not None:
            with contextlib.suppress(Exception):  # (the proxy may be stopped: interpreter exit)
                await self.gate.close()
        self.context = self.page = self.gate = None
