"""A local stand-in for the Hugging Face Hub's upload endpoints (the Hub cannot be reached from
the test machines): a real HTTP server on loopback that answers the requests
``huggingface_hub.HfApi.create_repo`` and ``upload_folder`` make, for small files ("regular"
uploads, no LFS), and writes each committed file under ``root/<namespace>/<name>/``. It checks
the bearer token, so a test can see that the client sent the user's token (and where it went).

It keeps each dataset repository's visibility as the Hub does: ``create_repo`` sets it for a new
repository (``"visibility"``: ``"private"`` or ``"public"``, public when absent) and answers 409
for an existing one; ``repo_info`` (``GET /api/datasets/<id>``) reports ``private``; and
``update_repo_settings`` (``PUT /api/datasets/<id>/settings``, ``{"visibility": …}``, or the
older ``{"private": …}``) changes it, or answers 403 when ``refuse_settings`` is set (a token
that may push but not change settings).
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class HubStandIn:
    """``with HubStandIn(root, token) as hub:`` … ``hub.url`` is the endpoint (``HF_ENDPOINT``)."""

    def __init__(
        self,
        root: Path,
        token: str,
        *,
        repos: dict[str, bool] | None = None,
        refuse_settings: bool = False,
    ) -> None:
        self.root, self.token = root, token
        self.requests: list[str] = []
        self.repos: dict[str, bool] = dict(repos or {})  # "me/name" -> private
        self.refuse_settings = refuse_settings
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _read(self) -> tuple[bytes, list[str]] | None:
                """The body and the path's parts; None when the token is wrong (answered)."""
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    self._send(401, {"error": "Invalid credentials"})
                    return None
                return body, self.path.split("?")[0].strip("/").split("/")

            def do_GET(self) -> None:
                read = self._read()
                if read is None:
                    return
                _, parts = read
                name = "/".join(parts[2:4])
                if parts[:2] == ["api", "datasets"] and len(parts) in (4, 6):
                    if name not in hub.repos:
                        return self._send(404, {"error": "Repository not found"})
                    info = {"id": name, "private": hub.repos[name], "sha": "0" * 40}
                    return self._send(200, info)
                return self._send(404, {"error": f"not served here: {self.path}"})

            def do_PUT(self) -> None:
                read = self._read()
                if read is None:
                    return
                body, parts = read
                name = "/".join(parts[2:4])
                if len(parts) == 5 and parts[:2] == ["api", "datasets"] and parts[4] == "settings":
                    if name not in hub.repos:
                        return self._send(404, {"error": "Repository not found"})
                    if hub.refuse_settings:
                        return self._send(403, {"error": "You cannot change this repo's settings"})
                    req = json.loads(body)
                    if "visibility" in req:
                        hub.repos[name] = req["visibility"] == "private"
                    elif "private" in req:
                        hub.repos[name] = bool(req["private"])
                    return self._send(200, {})
                return self._send(404, {"error": f"not served here: {self.path}"})

            def do_POST(self) -> None:
                read = self._read()
                if read is None:
                    return
                body, parts = read
                if parts[:3] == ["api", "repos", "create"]:
                    req = json.loads(body)
                    name = f"{req.get('organization') or 'me'}/{req['name']}"
                    url = f"{hub.url}/datasets/{name}"
                    if name in hub.repos:
                        return self._send(
                            409, {"error": "You already created this repo", "url": url}
                        )
                    hub.repos[name] = req.get("visibility") == "private"
                    return self._send(200, {"url": url, "name": name})
                if parts[:2] == ["api", "validate-yaml"]:
                    return self._send(200, {"errors": [], "warnings": []})
                if len(parts) == 6 and parts[:2] == ["api", "datasets"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    modes = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files
                    ]
                    return self._send(200, {"files": modes})
                if len(parts) == 6 and parts[:2] == ["api", "datasets"] and parts[4] == "commit":
                    repo = hub.root / parts[2] / parts[3]
                    for line in body.splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            v = item["value"]
                            out = repo / v["path"]
                            out.parent.mkdir(parents=True, exist_ok=True)
                            out.write_bytes(base64.b64decode(v["content"]))
                    url = f"{hub.url}/datasets/{parts[2]}/{parts[3]}/commit/{'0' * 40}"
                    return self._send(200, {"commitUrl": url, "commitOid": "0" * 40})
                return self._send(404, {"error": f"not served here: {self.path}"})

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
