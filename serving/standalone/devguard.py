"""The guard of a model server's development endpoints: in-place weight reloads
(``POST /collective_rpc``) and, on vLLM, its cache, sleep and RL endpoints.

Dev mode lets whoever can reach the port swap the served weights; a web page in the user's own
browser can reach a loopback port (a ``text/plain`` POST needs no CORS pre-flight) and so can
a DNS-rebinding page. :class:`DevGuard` is plain ASGI middleware (standard library only:
vLLM loads it as ``--middleware devguard.DevGuard`` from its own environment, the ``hf`` engine
wraps its app in it). Every request to a path that is not public (``/v1/...``, ``/health`` and
the other read-only paths in :data:`PUBLIC`) must pass, in order:

1. no ``Origin`` header (403): browsers send one with every cross-origin request and with
   every POST; the supervisor sends none;
2. a ``Host`` header equal to the bound ``address:port`` (403): a DNS-rebinding page's requests
   name the attacker's host;
3. ``Authorization: Bearer TOKEN`` with the launch's token (401), compared in constant time;
4. for a request other than GET / HEAD, ``Content-Type: application/json`` (415);
5. for ``/collective_rpc``: a JSON object (400) calling ``reload_weights`` and nothing else
   (403) with one absolute ``weights_path`` (400) that lies inside the reload root once
   symlinks and ``..`` are resolved (403). The engine receives the resolved path, so it loads
   the folder that was checked.

Configuration comes from the arguments or, as vLLM builds its middleware without any, from the
environment: :data:`TOKEN_ENV` (the bearer token: the supervisor draws one per launch and passes
it in the environment only, never on a command line), :data:`HOST_ENV` (``address:port``) and
:data:`ROOT_ENV` (the folder reloads may come from). A missing token, a non-loopback address or
the filesystem root as reload root refuse to start (:class:`GuardConfigError`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

TOKEN_ENV = "WEBLOOP_RELOAD_TOKEN"
HOST_ENV = "WEBLOOP_RELOAD_HOST"
ROOT_ENV = "WEBLOOP_RELOAD_ROOT"
MIN_TOKEN_CHARS = 32
RPC_PATH = "/collective_rpc"
RELOAD_METHOD = "reload_weights"
MAX_BODY = 64 * 1024
# read-only or OpenAI-protocol paths: left to the engine (everything else is guarded)
PUBLIC = frozenset(
    {"/health", "/ping", "/version", "/metrics", "/load", "/tokenize", "/detokenize"}
)
PUBLIC_PREFIX = "/v1/"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class GuardConfigError(RuntimeError):
    """The guard cannot protect the endpoints as configured (the server must not start)."""


class Refused(Exception):
    """A request the guard refuses: its HTTP status and the reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_header(host: str, port: int) -> str:
    """The ``Host`` header a client of ``host``:``port`` sends (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class DevGuard:
    """ASGI middleware refusing every request to a development endpoint that does not come from
    the process holding the launch's token (see the module doc). ``token``, ``host``
    (``address:port``) and ``root`` default to :data:`TOKEN_ENV`, :data:`HOST_ENV` and
    :data:`ROOT_ENV`."""

    def __init__(
        self, app: Any, token: str | None = None, host: str | None = None, root: str | None = None
    ) -> None:
        self.app = app
        token = token or os.environ.get(TOKEN_ENV, "")
        if len(token) < MIN_TOKEN_CHARS:
            raise GuardConfigError(
                f"dev mode needs a reload token of {MIN_TOKEN_CHARS}+ characters in ${TOKEN_ENV}"
            )
        self._digest = hashlib.sha256(token.encode()).digest()
        self.host = (host or os.environ.get(HOST_ENV, "")).lower()
        address = self.host.rpartition(":")[0].strip("[]")
        if not is_loopback(address):
            raise GuardConfigError(
                f"dev mode is served on loopback only, not on {address or '(no address)'!r}"
            )
        root = root or os.environ.get(ROOT_ENV, "")
        if not root:
            raise GuardConfigError(f"dev mode needs the reload root (${ROOT_ENV})")
        self.root = os.path.realpath(root)
        if os.path.dirname(self.root) == self.root:
            raise GuardConfigError(f"the reload root may not be the filesystem root ({root!r})")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or _public(scope):
            await self.app(scope, receive, send)
            return
        try:
            self.check(scope)
            if scope["type"] == "http" and _path(scope) == RPC_PATH:
                scope, receive = await self._checked_rpc(scope, receive)
        except Refused as refused:
            await _refuse(scope, send, refused)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> None:
        """Refuse (:class:`Refused`) a request whose headers do not pass steps 1-4."""
        if _headers(scope, b"origin"):
            raise Refused(403, "cross-origin requests to the development endpoints are refused")
        hosts = _headers(scope, b"host")
        if [h.lower() for h in hosts] != [self.host]:
            raise Refused(403, f"Host {', '.join(hosts) or '(none)'} is not this server's address")
        auth = _headers(scope, b"authorization")
        scheme, _, given = auth[0].partition(" ") if len(auth) == 1 else ("", "", "")
        digest = hashlib.sha256(given.strip().encode()).digest()
        if not (hmac.compare_digest(digest, self._digest) and scheme.lower() == "bearer"):
            raise Refused(401, "the development endpoints need the launch's bearer token")
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD"):
            kind = (_headers(scope, b"content-type") or [""])[0].partition(";")[0]
            if kind.strip().lower() != "application/json":
                raise Refused(415, "the development endpoints take application/json only")

    async def _checked_rpc(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive]:
        """Step 5: the scope and body stream of the reload call to pass on (the weights path
        resolved), or :class:`Refused`."""
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Refused(400, "the client went away")
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                raise Refused(413, "the request body is too large")
            if not message.get("more_body"):
                break
        forwarded = json.dumps(self.reload_call(body)).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(forwarded)).encode()))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": forwarded, "more_body": False}

        return {**scope, "headers": headers}, replay

    def reload_call(self, body: bytes) -> dict[str, Any]:
        """The ``reload_weights`` call of ``body`` with its weights path resolved, or
        :class:`Refused` (any other method, argument, or a path outside the root)."""
        try:
            call = json.loads(body)
        except ValueError:
            raise Refused(400, "the request body is not JSON") from None
        if not isinstance(call, dict):
            raise Refused(400, "the request body must be a JSON object")
        if call.get("method") != RELOAD_METHOD:
            raise Refused(403, f"only {RELOAD_METHOD} is served, not {call.get('method')!r}")
        kwargs = call.get("kwargs")
        if call.get("args") or not isinstance(kwargs, dict) or set(kwargs) != {"weights_path"}:
            raise Refused(403, f"{RELOAD_METHOD} takes exactly one argument, weights_path")
        path = kwargs["weights_path"]
        if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
            raise Refused(400, f"weights_path must be an absolute folder path, not {path!r}")
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.root]) != self.root:
            raise Refused(403, f"weights_path {path!r} is outside the reload root {self.root}")
        out: dict[str, Any] = {"method": RELOAD_METHOD, "kwargs": {"weights_path": real}}
        timeout = call.get("timeout")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            out["timeout"] = timeout
        return out


def _path(scope: Scope) -> str:
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _public(scope: Scope) -> bool:
    path = _path(scope)
    return path in PUBLIC or path.startswith(PUBLIC_PREFIX)


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name]


async def _refuse(scope: Scope, send: Send, refused: Refused) -> None:
    if scope["type"] == "websocket":  # closed before the handshake: the client sees a 403
        await send({"type": "websocket.close", "code": 1008})
        return
    err = {"message": str(refused), "type": "dev_endpoint_refused", "code": refused.status}
    body = json.dumps({"error": err}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if refused.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
