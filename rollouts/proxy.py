"""The rollout browser's origin allowlist at the network layer: a local forward HTTP proxy.

A Playwright route handler (the first layer, in :mod:`rollouts.env`) sees the requests a page
starts, but not a redirect's next hop, WebSocket handshakes or anything below HTTP. Every
connection of a proxied Chromium context goes through the proxy instead, so the proxy is the
place where the allowlist holds for all of them:

* plain HTTP (an absolute-URI request line): forwarded when its origin is allowed — including
  each hop of a redirect chain, which Chromium sends as a new request;
* ``CONNECT host:port`` (https, and every ws:// and wss:// WebSocket: Chromium always tunnels
  them through an HTTP proxy): tunnelled when host and port belong to an allowed origin;
* anything else is refused and recorded: a plain request by its URL, a tunnel as
  ``"CONNECT host:port"`` (the proxy never learns a tunnel's scheme or path). A refused request
  gets no byte of the other origin: a plain one a connection closed without a response
  (Chromium: ``net::ERR_EMPTY_RESPONSE``, so a refused navigation fails like one the route
  layer aborts, rather than showing a page at the other origin's URL), a tunnel a 403
  (``net::ERR_TUNNEL_CONNECTION_FAILED``). Chromium retries a request whose reused connection
  closes; every response the proxy forwards says ``Connection: close``, so requests come on
  fresh connections and a refusal is recorded once.

An allowed origin's host name is not trusted to stay where its name says: the proxy resolves it
(the gate's ``resolver``, :func:`socket.getaddrinfo` off the event loop), vets every address
with :func:`warehouse.urls.address_problem` (the start URLs' policy) and dials a vetted address,
never the name again (a second lookup could answer otherwise: DNS rebinding). Link-local and
cloud metadata addresses are always refused; loopback, private and reserved ones only where the
allowlist names the address itself (an IP literal such as the bundled sites'
``http://127.0.0.1:PORT``, whose start URLs the collect stage vetted) or the gate was opened with
``allow_private`` (``webloop collect --allow-private``; by default the calling context's
:data:`PRIVATE_ALLOWED`). One refused address refuses the host. Such a refusal is recorded like
the others and answered with a ``403`` whose text names the host, the address and why (the
origin is allowed, so the browser may show that page at its URL).

One :class:`AllowlistProxy` serves a whole process on its own thread and event loop (a busy
rollout loop must not hold up every request of every page). Each episode opens a :class:`Gate`:
its own listening port on 127.0.0.1 with its own allowlist and recorder, so the proxy knows the
episode from the port a connection arrives on — no proxy credentials, hence no 407 round trip
per connection and no reliance on Chromium answering proxy auth for WebSocket tunnels. Closing
the gate closes its port and every connection it carries. Chromium must send loopback through
the proxy too (it bypasses proxies for loopback by default; the sites all run on 127.0.0.1):
:meth:`Gate.playwright_proxy` sets the bypass rule ``<-loopback>``.

WebRTC's UDP does not go through an HTTP proxy at all: Chromium is launched with the WebRTC IP
handling policy ``disable_non_proxied_udp`` (:data:`rollouts.browser.CHROMIUM_ARGS`), which leaves
WebRTC only TCP through this proxy.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from warehouse.urls import IPAddress, address_problem

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
HEAD_LIMIT = 256 * 1024  # the longest request or response head accepted (as Chromium's)
CHUNK = 64 * 1024
DIAL_TIMEOUT_S = 10.0  # connecting upstream (loopback answers at once; a dead host does not)
HEAD_TIMEOUT_S = 60.0  # an idle client connection that never sends its request head
CALL_TIMEOUT_S = 30.0  # opening or closing a gate on the proxy's loop
_HOP_HEADERS = {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization"}
_REFUSAL = b"refused by the episode's origin allowlist\n"
_REFUSE_TUNNEL = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_REFUSAL), _REFUSAL)
)

_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

Resolver = Callable[..., list[tuple[Any, ...]]]
"""A host name's addresses, called as ``resolver(host, port, type=socket.SOCK_STREAM)`` and
answering as :func:`socket.getaddrinfo` does (the address is ``entry[4][0]``); tests inject one."""

PRIVATE_ALLOWED: ContextVar[bool] = ContextVar("webloop_private_allowed", default=False)
"""Whether gates opened in this context admit allowed names that resolve to loopback or private
addresses (the collect stage's ``allow_private``): see :func:`private_addresses_allowed`."""


@contextlib.contextmanager
def private_addresses_allowed(allowed: bool = True) -> Iterator[None]:
    """Within this block (and the asyncio tasks it starts) :meth:`AllowlistProxy.open` admits,
    or with ``allowed=False`` refuses, loopback and private answers to allowed names."""
    token = PRIVATE_ALLOWED.set(allowed)
    try:
        yield
    finally:
        PRIVATE_ALLOWED.reset(token)


class AddressRefused(Exception):
    """An allowed host whose address the proxy may not dial; the message says which and why."""


def _refusal(reason: str) -> bytes:
    """The 403 that answers an address refusal, its text naming host, address and reason."""
    body = f"refused by the episode's allowlist proxy: {reason}\n".encode()
    return (
        b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def _literal(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is one (IPv6 without brackets), else None."""
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host)
    return None


def endpoint(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an absolute http(s)/ws(s) URL or origin, the port filled in
    from the scheme when the URL has none (an origin includes its port); None for anything
    else."""
    try:
        p = urlsplit(url)
        port = p.port
    except ValueError:
        return None
    scheme = p.scheme.lower()
    if scheme not in DEFAULT_PORTS or not p.hostname:
        return None
    return scheme, p.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


class Allowlist:
    """The origins one episode may reach (immutable). A plain request must match an origin's
    scheme, host and port; a tunnel only host and port (a CONNECT does not say whether https or
    a WebSocket goes through it: an allowed ``http://host:port`` admits ``ws://host:port``)."""

    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(e for o in origins if (e := endpoint(o)) is not None)
        self.hosts = frozenset((host, port) for _, host, port in self.origins)

    def allows_url(self, url: str) -> bool:
        return endpoint(url) in self.origins

    def allows_tunnel(self, host: str, port: int) -> bool:
        return (host.lower(), port) in self.hosts


def split_authority(authority: str) -> tuple[str, int] | None:
    """``host:port`` of a CONNECT request (``[::1]:443`` too); None when malformed."""
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def _origin_form(url: str) -> bytes:
    """The request target an origin server expects: path and query of an absolute URL."""
    p = urlsplit(url)
    return ((p.path or "/") + (f"?{p.query}" if p.query else "")).encode("latin-1")


def _header_lines(head: bytes) -> tuple[bytes, list[bytes]]:
    """The first line of a head and its header lines (without the blank line)."""
    first, *lines = head.rstrip(b"\r\n").split(b"\r\n")
    return first, lines


def _name(line: bytes) -> bytes:
    return line.partition(b":")[0].strip().lower()


def upstream_request_head(method: bytes, url: str, version: bytes, lines: list[bytes]) -> bytes:
    """The request head for the origin server: origin-form target, proxy headers dropped, and
    ``Connection: close`` (one request per upstream connection: the proxy need not parse
    message framing) unless the client asks for a protocol upgrade, which stays intact."""
    upgrade = any(_name(h) == b"upgrade" for h in lines) and any(
        _name(h) == b"connection" and b"upgrade" in h.lower() for h in lines
    )
    kept = [h for h in lines if _name(h) not in _HOP_HEADERS]
    kept.append(b"Connection: Upgrade" if upgrade else b"Connection: close")
    return b"\r\n".join([b" ".join((method, _origin_form(url), version)), *kept]) + b"\r\n\r\n"


def client_response_head(head: bytes) -> bytes:
    """A final response head for the browser, told ``Connection: close`` (the proxy closes the
    connection after it: see :func:`upstream_request_head`). A ``101 Switching Protocols`` is
    passed through untouched."""
    first, lines = _header_lines(head)
    if _status(first) == 101:
        return head
    kept = [h for h in lines if _name(h) not in _HOP_HEADERS]
    return b"\r\n".join([first, *kept, b"Connection: close"]) + b"\r\n\r\n"


def _status(first_line: bytes) -> int:
    parts = first_line.split(None, 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy ``src`` to ``dst`` until end of stream (or a broken connection)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()


async def _first_done(*coros: Coroutine[Any, Any, None]) -> None:
    """Run ``coros`` until one finishes (one direction of a connection ended: the exchange is
    over), then cancel the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection after what was written to it has been sent."""
    with contextlib.suppress(Exception):
        writer.close()


class Gate:
    """One episode's door through the proxy: a listening port on 127.0.0.1, the episode's
    :class:`Allowlist` and ``record`` (called on the proxy's thread, with the refused URL, before
    the browser learns of the refusal), and ``allow_private`` (allowed names may resolve to
    loopback and private addresses). Made by :meth:`AllowlistProxy.open`; lives on the proxy's
    loop, closed with :meth:`close` from the caller's loop."""

    def __init__(
        self,
        proxy: AllowlistProxy,
        allowlist: Allowlist,
        record: Callable[[str], None],
        allow_private: bool = False,
    ) -> None:
        self.proxy, self.allowlist, self.record = proxy, allowlist, record
        self.allow_private = allow_private
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def playwright_proxy(self) -> dict[str, str]:
        """The ``proxy=`` option of ``browser.new_context``: this gate, loopback included."""
        return {"server": self.server, "bypass": "<-loopback>"}

    async def close(self) -> None:
        """Close the port and every connection through it (from any event loop)."""
        await self.proxy._call(self._shut())

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT, backlog=256
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.proxy._gates.add(self)

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.proxy._gates.discard(self)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            await self._handle(head, reader, writer)
        except (
            ConnectionError,
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            _close(writer)
            self._tasks.discard(task)

    async def _handle(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        first, lines = _header_lines(head)
        parts = first.split()
        if len(parts) != 3:
            return
        method, target, version = parts
        if method.upper() == b"CONNECT":
            await self._tunnel(target.decode("latin-1"), reader, writer)
            return
        url = target.decode("latin-1")
        if not self.allowlist.allows_url(url):
            self.record(url)  # refused: close without a response (see the module docstring)
            return
        ep = endpoint(url)
        assert ep is not None  # allowed, so an http(s)/ws(s) URL
        try:
            addresses = await self._addresses(ep[1])
        except AddressRefused as exc:
            await self._refuse(url, str(exc), writer)
            return
        head = upstream_request_head(method, url, version, lines)
        await self._forward(head, addresses, ep[2], reader, writer)

    async def _tunnel(
        self, authority: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        where = split_authority(authority)
        if where is None or not self.allowlist.allows_tunnel(*where):
            self.record(f"CONNECT {authority}")
            writer.write(_REFUSE_TUNNEL)
            await writer.drain()
            return
        try:
            addresses = await self._addresses(where[0])
        except AddressRefused as exc:
            await self._refuse(f"CONNECT {authority}", str(exc), writer)
            return
        up = await self._dial(addresses, where[1])
        if up is None:
            writer.write(_BAD_GATEWAY)
            return
        up_reader, up_writer = up
        try:
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await _first_done(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            _close(up_writer)

    async def _refuse(self, what: str, reason: str, writer: asyncio.StreamWriter) -> None:
        """Record ``what`` (a URL or ``CONNECT host:port``) and answer the address refusal."""
        self.record(what)
        writer.write(_refusal(reason))
        await writer.drain()

    async def _addresses(self, host: str) -> list[IPAddress]:
        """The vetted addresses of an allowed ``host`` (see the module docstring): the literal
        itself, or every address its name resolves to; empty when the name does not resolve.
        Raises :class:`AddressRefused`."""
        literal = _literal(host)
        if literal is not None:  # named by the allowlist itself: no lookup to trust
            problem = address_problem(literal, allow_private=True)
            if problem:
                raise AddressRefused(f"the host {host} is {problem}")
            return [literal]
        addresses = await self.proxy.resolve(host)
        for ip in addresses:
            problem = address_problem(ip, allow_private=self.allow_private)
            if problem:
                raise AddressRefused(f"the host {host} resolves to {ip}, {problem}")
        return addresses

    async def _forward(
        self,
        request_head: bytes,
        addresses: list[IPAddress],
        port: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        up = await self._dial(addresses, port)
        if up is None:
            writer.write(_BAD_GATEWAY)
            return
        up_reader, up_writer = up
        try:
            up_writer.write(request_head)
            # the request body (or an upgraded protocol's frames) flows on meanwhile
            await _first_done(_pump(reader, up_writer), _respond(up_reader, writer))
        finally:
            _close(up_writer)

    async def _dial(
        self, addresses: list[IPAddress], port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the first of the vetted ``addresses`` that answers (an address, so
        no lookup happens here); None when none does."""
        for ip in addresses:
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(
                    asyncio.open_connection(str(ip), port, limit=HEAD_LIMIT), DIAL_TIMEOUT_S
                )
        return None


async def _respond(up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Relay the origin's response: interim 1xx heads as they are, the final head rewritten by
    :func:`client_response_head`, then the rest of the stream (body, or an upgraded protocol)."""
    while True:
        head = await up_reader.readuntil(b"\r\n\r\n")
        status = _status(_header_lines(head)[0])
        if 100 <= status < 200 and status != 101:
            writer.write(head)
            continue
        writer.write(client_response_head(head))
        break
    await writer.drain()
    await _pump(up_reader, writer)


class AllowlistProxy:
    """The process's allowlisting proxy: one daemon thread running one event loop that carries
    every :class:`Gate`. Start it with :meth:`start` (or use :func:`shared_proxy`), open a gate per
    episode with :meth:`open` from any event loop, and :meth:`stop` it (closes every gate and
    connection and joins the thread). Also a context manager. ``resolver``: how host names
    become addresses (default :func:`socket.getaddrinfo`; see :data:`Resolver`)."""

    def __init__(self, resolver: Resolver = socket.getaddrinfo) -> None:
        self.resolver = resolver
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._gates: set[Gate] = set()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """Whether the proxy's thread runs (False in a forked child: its thread stayed behind)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> AllowlistProxy:
        """Start the thread and loop, unless running (idempotent; restarts after :meth:`stop`,
        and in a forked child, whose copy of the proxy has no thread)."""
        with self._lock:
            if not self.running:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="webloop-allowlist-proxy", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
        return self

    def stop(self) -> None:
        """Close every gate and connection, stop the loop and join its thread (idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or not thread.is_alive():
            return  # never started, stopped, or a forked child's copy (nothing runs here)

        async def shut() -> None:
            await asyncio.gather(*(g._shut() for g in list(self._gates)))

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(CALL_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CALL_TIMEOUT_S)
        loop.close()

    def __enter__(self) -> AllowlistProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def open(
        self,
        origins: Iterable[str],
        record: Callable[[str], None],
        *,
        allow_private: bool | None = None,
    ) -> Gate:
        """A new :class:`Gate` admitting ``origins`` (URLs or origins; anything but http(s) and
        ws(s) is ignored) and reporting each refusal to ``record`` — called on the proxy's
        thread: give a thread-safe callable (``list.append`` is). ``allow_private``: whether
        allowed names may resolve to loopback and private addresses (None: the calling
        context's :data:`PRIVATE_ALLOWED`)."""
        if allow_private is None:
            allow_private = PRIVATE_ALLOWED.get()
        gate = Gate(self, Allowlist(origins), record, allow_private)
        await self._call(gate._listen())
        return gate

    async def resolve(self, host: str) -> list[IPAddress]:
        """Every address ``host`` resolves to, looked up off the event loop (on a worker thread,
        bounded by :data:`DIAL_TIMEOUT_S`); empty when it does not resolve."""
        try:
            answers = await asyncio.wait_for(
                asyncio.to_thread(self.resolver, host, 0, type=socket.SOCK_STREAM),
                DIAL_TIMEOUT_S,
            )
        except (OSError, TimeoutError, UnicodeError):
            return []
        addresses: list[IPAddress] = []
        for entry in answers:
            try:
                ip = ipaddress.ip_address(entry[4][0])
            except ValueError:
                raise AddressRefused(f"the host {host} resolves to {entry[4][0]!r}") from None
            if ip not in addresses:
                addresses.append(ip)
        return addresses

    async def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the proxy's loop and wait for it without blocking the caller's."""
        loop = self._loop
        if loop is None or not self.running:
            coro.close()
            raise RuntimeError("the allowlist proxy is not running")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        # (bounded: a loop stopped under this call would leave the future pending forever)
        await asyncio.wait_for(asyncio.wrap_future(future), CALL_TIMEOUT_S)


_shared: AllowlistProxy | None = None
_shared_lock = threading.Lock()


def shared_proxy() -> AllowlistProxy:
    """The process's proxy, started on first use and stopped when the interpreter exits."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AllowlistProxy()
            atexit.register(_shared.stop)
        return _shared.start()
