"""The origin allowlist holds below the page: redirect hops, WebSockets and WebRTC cannot reach
another origin, and each refusal is recorded in the episode's ``blocked`` list. An allowed name
is not trusted to resolve where it says: the proxy vets every address (a resolver injected here,
mapping ``allowed.example`` onto a loopback server) and dials only vetted ones.

Two real loopback origins: A (allowed; a Starlette app with redirects, a frame, a WebSocket
endpoint and a page whose buttons fetch and open sockets) and B (forbidden; a raw TCP server that
counts every connection it accepts, before it answers, and serves a page marked
:data:`B_MARK`, readable cross-origin). Episodes run in contexts of the session's Chromium
(``chromium`` fixture), through the process's allowlisting proxy (:mod:`rollouts.proxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from rollouts.actions import parse_action
from rollouts.browser import SharedSlot
from rollouts.env import BrowserEnv, EnvConfig
from rollouts.localserver import ThreadedServer
from rollouts.proxy import (
    Allowlist,
    AllowlistProxy,
    Gate,
    Resolver,
    endpoint,
    private_addresses_allowed,
)

browser = pytest.mark.browser
B_MARK = "B-SECRET-0451"
PIXEL_GIF = bytes.fromhex(  # a 1x1 GIF
    "47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b"
)


class CountingOrigin:
    """Origin B: a threaded TCP server on a free loopback port. ``hits`` gets an entry for every
    connection, appended as it is accepted (before anything is read or answered), so whatever
    the browser saw of B, B has counted. Every request gets a small page holding
    :data:`B_MARK` with ``Access-Control-Allow-Origin: *`` (a page could read it if it got it)."""

    def __init__(self) -> None:
        hits: list[bytes] = []
        body = f"<title>B page</title><p>{B_MARK}</p>".encode()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                i = len(hits)
                hits.append(b"")  # counted on accept; the request line, if any, replaces it
                self.request.settimeout(2)
                with contextlib.suppress(OSError):
                    hits[i] = self.request.recv(4096).split(b"\r\n")[0]
                    self.request.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                        b"Access-Control-Allow-Origin: *\r\nConnection: close\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                    )

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True

        self.hits = hits
        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> CountingOrigin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


HOME = """<!doctype html><title>A home</title><h1>A home</h1>
<img id="pixel" src="/pixel.gif" alt="pixel">
<button id="fetch-b" onclick="show(fetch('/to-b'))">fetch a redirect to B</button>
<button id="fetch-a" onclick="show(fetch('/to-data'))">fetch a redirect within A</button>
<button id="socket-b" onclick="sock('ws://127.0.0.1:%(b_port)d/')">socket to B</button>
<button id="socket-a" onclick="sock('ws://' + location.host + '/ws')">socket to A</button>
<output id="out"></output>
<script>
function out(s) { document.getElementById('out').textContent = s; }
function show(p) { p.then(r => r.text()).then(t => out('read:' + t), e => out('error:' + e.name)); }
function sock(url) {
  const w = new WebSocket(url);
  w.onmessage = e => out('message:' + e.data);
  w.onerror = () => out('error');
}
</script>"""


def origin_a(b: CountingOrigin) -> Starlette:
    """Origin A's app: ``/to-b`` redirects to B, ``/to-a`` and ``/to-data`` within A."""

    async def ws(socket_: WebSocket) -> None:
        await socket_.accept()
        await socket_.send_text("hello from A")
        await socket_.close()

    def page(html: str) -> Any:
        return lambda request: HTMLResponse(html)

    def redirect(to: str) -> Any:
        return lambda request: RedirectResponse(to, status_code=302)

    def pixel(request: Request) -> Response:
        return Response(PIXEL_GIF, media_type="image/gif")

    return Starlette(
        routes=[
            Route("/", page(HOME % {"b_port": b.port})),
            Route("/pixel.gif", pixel),
            Route("/to-b", redirect(f"{b.url}/secret")),
            Route("/to-a", redirect("/landed")),
            Route("/to-data", redirect("/data")),
            Route("/landed", page("<title>landed</title><p>landed on A</p>")),
            Route("/data", lambda request: Response("data from A")),
            Route("/frame", page("<title>frame</title><iframe src='/to-b'></iframe>")),
            WebSocketRoute("/ws", ws),
        ]
    )


@pytest.fixture
def b() -> Iterator[CountingOrigin]:
    with CountingOrigin() as origin:
        yield origin


@pytest.fixture
def a(b: CountingOrigin) -> Iterator[str]:
    with ThreadedServer(origin_a(b)) as server:
        yield server.base


@contextlib.asynccontextmanager
async def episode(chromium: Any, start_url: str):
    """A :class:`BrowserEnv` episode on the session's Chromium, allowed only ``start_url``'s
    origin; the first observation."""
    env = BrowserEnv(SharedSlot(chromium.browser), EnvConfig(action_timeout_s=5))
    try:
        obs, _ = await env.reset(options={"start_url": start_url, "max_steps": 10})
        yield env, obs
    finally:
        await env.close()


async def click_and_read(env: BrowserEnv, button: str) -> tuple[str, dict[str, Any]]:
    """Click ``button`` on A's home page; what the page wrote to its output (waits for the
    page's own fetch / socket event), and the step's info."""
    *_, info = await env.step(parse_action(f'click(css="#{button}")'))
    await env.page.wait_for_function("document.getElementById('out').textContent !== ''")
    return await env.page.text_content("#out"), info


# -- redirect hops ---------------------------------------------------------------------------


@browser
def test_a_redirect_to_another_origin_is_refused_and_recorded(a, b, chromium):
    async def go():
        async with episode(chromium, a + "/") as (env, _):
            obs, *_, info = await env.step(parse_action(f'goto("{a}/to-b")'))
            return obs, info

    obs, info = chromium.run(go())
    assert b.hits == []
    assert f"{b.url}/secret" in info["blocked"]
    assert not obs.url.startswith(b.url) and obs.title != "B page"
    assert B_MARK not in obs.a11y
    assert info["error"]  # the navigation failed, as a refused direct one does


@browser
def test_an_iframe_redirected_to_another_origin_is_refused_and_recorded(a, b, chromium):
    async def go():
        async with episode(chromium, a + "/frame") as (env, obs):
            contents = [await f.content() for f in env.page.frames]
            return obs, contents, list(env.blocked)

    obs, contents, blocked = chromium.run(go())
    assert b.hits == []
    assert f"{b.url}/secret" in blocked
    assert not any(B_MARK in c for c in contents) and B_MARK not in obs.a11y


@browser
def test_a_fetch_redirected_to_another_origin_cannot_read_it(a, b, chromium):
    async def go():
        async with episode(chromium, a + "/") as (env, _):
            return await click_and_read(env, "fetch-b")

    out, info = chromium.run(go())
    assert b.hits == []
    assert out.startswith("error:") and B_MARK not in out
    assert f"{b.url}/secret" in info["blocked"]


# -- sockets ---------------------------------------------------------------------------------


@browser
def test_a_websocket_to_another_origin_never_connects(a, b, chromium):
    async def go():
        async with episode(chromium, a + "/") as (env, _):
            out, _ = await click_and_read(env, "socket-b")
            return out, list(env.blocked)

    out, blocked = chromium.run(go())
    assert out == "error"
    assert b.hits == []  # not even a TCP connection
    assert f"CONNECT 127.0.0.1:{b.port}" in blocked


GATHER_JS = """async (server) => {
  const pc = new RTCPeerConnection({iceServers: [server]});
  pc.createDataChannel('probe');
  const complete = new Promise(resolve => {
    pc.onicegatheringstatechange = () => {
      if (pc.iceGatheringState === 'complete') resolve();
    };
  });
  await pc.setLocalDescription(await pc.createOffer());
  await Promise.race([complete, new Promise(resolve => setTimeout(resolve, 20000))]);
  const state = pc.iceGatheringState;
  pc.close();
  return state;
}"""


async def gather(env: BrowserEnv, server: dict[str, str], until: Any = None) -> str:
    """ICE gathering in the page with one ICE ``server``; its state at the end: 'complete',
    or 'gathering' after the page's 20 s guard. ``until``: a future that ends the wait early
    (a datagram arrived): then 'interrupted'."""
    gathering = asyncio.ensure_future(env.page.evaluate(GATHER_JS, server))
    waits = {gathering} | ({asyncio.ensure_future(until)} if until is not None else set())
    done, _ = await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if gathering in done:
        return gathering.result()
    gathering.cancel()
    return "interrupted"


@contextlib.contextmanager
def udp_socket(loop: asyncio.AbstractEventLoop) -> Iterator[tuple[int, asyncio.Future[None]]]:
    """A UDP socket on a free loopback port: its port, and a future set when a datagram is
    waiting in it (nothing is read: the kernel's buffer stays the evidence)."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(udp.fileno(), lambda: readable.done() or readable.set_result(None))
    try:
        yield udp, readable
    finally:
        loop.remove_reader(udp.fileno())
        udp.close()


@browser
def test_webrtc_sends_no_udp_to_another_origin(a, chromium):
    async def go():
        with udp_socket(asyncio.get_running_loop()) as (udp, readable):
            async with episode(chromium, a + "/") as (env, _):
                # the wait ends when the page's ICE gathering completes (~0.1 s when UDP is
                # off) or when a datagram reaches the socket, whichever comes first
                stun = {"urls": f"stun:127.0.0.1:{udp.getsockname()[1]}"}
                state = await gather(env, stun, readable)
            with contextlib.suppress(BlockingIOError):
                return state, udp.recvfrom(2048)[0]  # anything sent before it completed
            return state, None

    state, datagram = chromium.run(go())
    assert datagram is None
    assert state == "complete"


@browser
def test_webrtc_turn_over_tcp_to_another_origin_is_refused_and_recorded(a, b, chromium):
    """With UDP off, WebRTC may still reach a TURN server over TCP: through the proxy."""

    async def go():
        async with episode(chromium, a + "/") as (env, _):
            turn = {"urls": f"turn:127.0.0.1:{b.port}?transport=tcp", "username": "u"}
            state = await gather(env, {**turn, "credential": "p"})
            return state, list(env.blocked)

    state, blocked = chromium.run(go())
    assert state == "complete"
    assert b.hits == []
    assert f"CONNECT 127.0.0.1:{b.port}" in blocked


# -- what stays allowed ----------------------------------------------------------------------


@browser
def test_the_allowed_origin_still_works_through_the_proxy(a, b, chromium):
    async def go():
        async with episode(chromium, a + "/") as (env, obs):
            pixel = await env.page.evaluate("document.getElementById('pixel').naturalWidth")
            fetched, _ = await click_and_read(env, "fetch-a")
            await env.page.evaluate("document.getElementById('out').textContent = ''")
            socket_, _ = await click_and_read(env, "socket-a")
            landed, *_, info = await env.step(parse_action(f'goto("{a}/to-a")'))
            data_url = "data:text/html,<title>inline</title>"
            inline = await env.page.evaluate(f"fetch('{data_url}').then(r => r.text())")
            return obs, pixel, fetched, socket_, landed, info, inline, list(env.blocked)

    obs, pixel, fetched, socket_, landed, info, inline, blocked = chromium.run(go())
    assert obs.title == "A home" and pixel == 1  # the page and its image came through
    assert fetched == "read:data from A"  # a fetch redirected within A
    assert socket_ == "message:hello from A"  # a WebSocket to A (a CONNECT tunnel)
    assert landed.url == f"{a}/landed" and "landed on A" in landed.a11y and not info["error"]
    assert inline == "<title>inline</title>"  # data: URLs stay allowed
    assert blocked == [] and b.hits == []


# -- the proxy itself, without a browser -----------------------------------------------------


def test_an_allowlist_compares_scheme_host_and_port():
    allow = Allowlist(["http://127.0.0.1:8000", "https://Example.com/path", "about:blank"])
    assert endpoint("http://example.com/") == ("http", "example.com", 80)
    assert allow.allows_url("http://127.0.0.1:8000/x?y")
    assert allow.allows_url("https://example.com:443/other")  # the default port is the port
    assert not allow.allows_url("http://127.0.0.1:8001/")  # another port, another origin
    assert not allow.allows_url("https://127.0.0.1:8000/")  # another scheme
    assert not allow.allows_url("http://example.com/")
    assert allow.allows_tunnel("127.0.0.1", 8000)  # ws:// to an allowed http origin
    assert allow.allows_tunnel("EXAMPLE.com", 443)
    assert not allow.allows_tunnel("example.com", 80)


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` to 127.0.0.1:``port``; everything it answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def test_the_proxy_forwards_refuses_and_stops_without_leaving_anything_behind(b):
    async def go(proxy: AllowlistProxy):
        refused: list[str] = []
        gate = await proxy.open([b.url], refused.append)
        ok = await exchange(gate.port, f"GET {b.url}/x HTTP/1.1\r\nHost: b\r\n\r\n".encode())
        other = "http://127.0.0.1:1/secret"
        no = await exchange(gate.port, f"GET {other} HTTP/1.1\r\nHost: o\r\n\r\n".encode())
        tunnel = await exchange(gate.port, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
        await gate.close()
        with pytest.raises(OSError):  # the gate's port is closed with it
            await asyncio.open_connection("127.0.0.1", gate.port)
        return ok, no, tunnel, refused, await proxy.open([], refused.append)

    def proxy_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "webloop-allowlist-proxy"}

    before = proxy_threads()  # (the process's shared proxy, if a browser test started it)
    proxy = AllowlistProxy().start()
    assert len(proxy_threads()) == len(before) + 1
    ok, no, tunnel, refused, open_gate = asyncio.run(go(proxy))
    assert ok.startswith(b"HTTP/1.1 200") and B_MARK.encode() in ok
    assert b"\r\nConnection: close\r\n" in ok
    assert b.hits == [b"GET /x HTTP/1.1"]  # origin-form, as an origin server expects
    assert no == b"" and tunnel.startswith(b"HTTP/1.1 403")
    assert refused == ["http://127.0.0.1:1/secret", "CONNECT 127.0.0.1:1"]

    proxy.stop()  # closes the gate left open, stops the loop, joins the thread
    assert not proxy.running and proxy_threads() == before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", open_gate.port), timeout=1)
    with pytest.raises(RuntimeError):
        asyncio.run(proxy.open([], refused.append))


# -- addresses: an allowed name is not trusted to resolve where it says ----------------------


def resolving(answers: dict[str, list[str]], asked: list[str] | None = None) -> Resolver:
    """A resolver shaped like :func:`socket.getaddrinfo` that answers ``answers`` (name →
    addresses) and nothing else (``socket.gaierror``), noting each name asked in ``asked``."""

    def resolve(host: str, port: int, *args: Any, **kw: Any) -> list[tuple[Any, ...]]:
        if asked is not None:
            asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        family = {4: socket.AF_INET, 6: socket.AF_INET6}
        return [
            (family[6 if ":" in a else 4], socket.SOCK_STREAM, 6, "", (a, port))
            for a in answers[host]
        ]

    return resolve


async def through_gate(
    proxy: AllowlistProxy, origin: str, host_port: str, **open_kw: Any
) -> tuple[bytes, bytes, list[str]]:
    """A plain GET of ``origin``/x and a CONNECT to ``host_port`` (a GET of /tunnelled sent
    through it at once) through a gate allowing ``origin``: both answers and what the gate
    recorded as refused."""
    refused: list[str] = []
    gate = await proxy.open([origin], refused.append, **open_kw)
    try:
        request = f"GET {origin}/x HTTP/1.1\r\nHost: {host_port}\r\n\r\n"
        plain = await exchange(gate.port, request.encode())
        connect = f"CONNECT {host_port} HTTP/1.1\r\n\r\nGET /tunnelled HTTP/1.1\r\n\r\n"
        tunnel = await exchange(gate.port, connect.encode())
    finally:
        await gate.close()
    return plain, tunnel, refused


def test_an_allowed_name_that_resolves_to_loopback_is_refused_and_never_dialled(b):
    origin, host_port = f"http://allowed.example:{b.port}", f"allowed.example:{b.port}"
    with AllowlistProxy(resolving({"allowed.example": ["127.0.0.1"]})) as proxy:
        plain, tunnel, refused = asyncio.run(through_gate(proxy, origin, host_port))
    assert b.hits == []  # the loopback server behind the name saw no connection at all
    why = b"the host allowed.example resolves to 127.0.0.1, a loopback, private or reserved"
    for answer in (plain, tunnel):
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and why in answer
        assert B_MARK.encode() not in answer
    assert refused == [f"{origin}/x", f"CONNECT {host_port}"]


@pytest.mark.parametrize(
    "addresses",
    [
        ["169.254.169.254"],  # AWS, GCP, Azure metadata
        ["169.254.170.2"],  # ECS task credentials (link-local)
        ["fd00:ec2::254"],  # AWS metadata over IPv6
        ["fe80::1"],  # IPv6 link-local
        ["::ffff:169.254.169.254"],  # the same, IPv4-mapped
        ["100.100.100.200"],  # Alibaba Cloud metadata
        ["93.184.216.34", "169.254.169.254"],  # one bad answer among good ones
    ],
)
def test_metadata_and_link_local_answers_are_refused_even_with_private_allowed(
    addresses: list[str], monkeypatch
):
    dialled: list[Any] = []

    async def dial(self: Gate, *args: Any) -> None:
        dialled.append(args)  # (never dials: the refusal must come first)

    monkeypatch.setattr(Gate, "_dial", dial)
    origin, host_port = "http://allowed.example", "allowed.example:80"
    with AllowlistProxy(resolving({"allowed.example": addresses})) as proxy:
        plain, tunnel, refused = asyncio.run(
            through_gate(proxy, origin, host_port, allow_private=True)
        )
    assert dialled == []
    for answer in (plain, tunnel):
        assert answer.startswith(b"HTTP/1.1 403 Forbidden")
        assert b"a link-local or cloud metadata address" in answer
        assert b"allowed.example resolves to" in answer
    assert refused == [f"{origin}/x", f"CONNECT {host_port}"]


def test_an_allowlisted_metadata_address_is_refused_without_a_lookup(monkeypatch):
    dialled: list[Any] = []

    async def dial(self: Gate, *args: Any) -> None:
        dialled.append(args)

    monkeypatch.setattr(Gate, "_dial", dial)
    asked: list[str] = []
    origin, host_port = "http://169.254.169.254", "169.254.169.254:80"
    with AllowlistProxy(resolving({}, asked)) as proxy:
        plain, tunnel, _ = asyncio.run(through_gate(proxy, origin, host_port, allow_private=True))
    assert dialled == [] and asked == []
    for answer in (plain, tunnel):
        assert answer.startswith(b"HTTP/1.1 403") and b"169.254.169.254 is a link-local" in answer


def test_with_private_allowed_the_loopback_answer_is_dialled_by_address(b):
    """``allowed.example`` does not resolve on this machine: only the vetted address can have
    reached the server, and the name was looked up once per connection (no second lookup
    between check and connect). The bundled sites' kind of origin, a loopback address the
    allowlist names itself, needs no opt-in and no lookup."""
    asked: list[str] = []
    origin, host_port = f"http://allowed.example:{b.port}", f"allowed.example:{b.port}"
    with AllowlistProxy(resolving({"allowed.example": ["127.0.0.1"]}, asked)) as proxy:
        plain, _, refused = asyncio.run(through_gate(proxy, origin, host_port, allow_private=True))
        assert asked == ["allowed.example", "allowed.example"]

        async def in_context() -> tuple[bytes, bytes, list[str]]:
            with private_addresses_allowed():  # the collect stage's --allow-private
                return await through_gate(proxy, origin, host_port)

        by_context, _, _ = asyncio.run(in_context())
        literal, _, literal_refused = asyncio.run(through_gate(proxy, b.url, f"127.0.0.1:{b.port}"))
    for answer in (plain, by_context, literal):
        assert answer.startswith(b"HTTP/1.1 200") and B_MARK.encode() in answer
    assert refused == literal_refused == []
    assert "127.0.0.1" not in asked  # the literal is not looked up
    assert b.hits == [b"GET /x HTTP/1.1", b"GET /tunnelled HTTP/1.1"] * 3


@browser
def test_a_browser_gets_the_refusal_for_a_name_on_loopback_and_the_page_with_the_opt_in(
    b, chromium
):
    """Through a real Chromium: the allowed start page's name resolves to the loopback server B;
    the browser shows the proxy's refusal (B never hears of it) unless private addresses are
    allowed, and then B's page."""
    start = f"http://allowed.example:{b.port}/"

    async def go(proxy: AllowlistProxy) -> tuple[Any, list[str], list[bytes], Any]:
        env = BrowserEnv(SharedSlot(chromium.browser), EnvConfig(action_timeout_s=5), proxy=proxy)
        try:
            refused_obs, _ = await env.reset(options={"start_url": start})
            blocked, hits = list(env.blocked), list(b.hits)
            with private_addresses_allowed():
                served_obs, _ = await env.reset(options={"start_url": start})
        finally:
            await env.close()
        return refused_obs, blocked, hits, served_obs

    with AllowlistProxy(resolving({"allowed.example": ["127.0.0.1"]})) as proxy:
        refused_obs, blocked, hits, served_obs = chromium.run(go(proxy))
    assert hits == []
    assert start in blocked
    assert "allowed.example resolves to 127.0.0.1" in refused_obs.a11y
    assert B_MARK not in refused_obs.a11y
    assert served_obs.title == "B page" and B_MARK in served_obs.a11y
    assert b.hits and b.hits[0] == b"GET / HTTP/1.1"
