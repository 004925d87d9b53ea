"""A local stand-in for the Hugging Face Hub's upload endpoints (the Hub cannot be reached from
the test machines): a real HTTP server on loopback that answers the requests
``huggingface_hub.HfApi.create_repo`` and ``upload_folder`` make, for small files ("regular"
uploads, no LFS), and writes each committed file under ``root/<namespace>/<name>/``. It checks
the bearer token, so a test can see that the client sent the user's token (and where it went).
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

    def __init__(self, root: Path, token: str) -> None:
        self.root, self.token = root, token
        self.requests: list[str] = []
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

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._send(401, {"error": "Invalid credentials"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "repos", "create"]:
                    req = json.loads(body)
                    name = f"{req.get('organization') or 'me'}/{req['name']}"
                    return self._send(200, {"url": f"{hub.url}/datasets/{name}", "name": name})
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
