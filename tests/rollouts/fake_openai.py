"""A real local HTTP server speaking the OpenAI chat-completions protocol, for tests.

It stands in for a remote model provider (which cannot exist here). Each request takes the next
scripted behaviour: ``("status", 500)``, ``("sleep", seconds)``, ``("garbage", text)`` (a
non-JSON body), ``("unauthorized", None)`` (a 401 whose body echoes the bearer key, as some
providers do), ``("reply", content)`` (a well-formed completion whose message is content), or
``("fn", f)`` (the reply is ``f(request body)``). Its log-probs name two tokens, by text, or by
id (``token_id:7``, ``token_id:9``) when the request asks ``return_tokens_as_token_ids``, as vLLM
does.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollouts.localserver import ThreadedServer


class FakeOpenAI:
    def __init__(
        self, script: list[tuple[str, Any]], default: tuple[str, Any] | None = None
    ) -> None:
        self.script = deque(script)
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.http = ThreadedServer(app)
        self.url = self.http.base + "/v1"

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        kind, arg = self.script.popleft() if self.script else self.default or ("status", 503)
        if kind == "unauthorized":
            key = request.headers.get("authorization", "").removeprefix("Bearer ")
            return JSONResponse({"error": f"Incorrect API key provided: {key}"}, status_code=401)
        if kind == "status":
            return JSONResponse({"error": "scripted"}, status_code=arg)
        if kind == "sleep":
            await asyncio.sleep(arg)
            kind, arg = "reply", 'Action: answer("late")'
        if kind == "fn":  # a reply computed from the request (a model that reads its prompt)
            kind, arg = "reply", arg(body)
        if kind == "garbage":
            return Response(arg, media_type="application/json")
        by_id = bool(body.get("return_tokens_as_token_ids"))
        tokens = ["token_id:7", "token_id:9"] if by_id else ["x", "y"]
        return JSONResponse(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": arg},
                        "logprobs": {
                            "content": [
                                {"token": tokens[0], "logprob": -0.25},
                                {"token": tokens[1], "logprob": -0.5},
                            ]
                        },
                    }
                ],
            }
        )

    def __enter__(self) -> FakeOpenAI:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)


def last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return (
        "".join(c.get("text", "") for c in content)
        if isinstance(content, list)
        else json.dumps(content)
    )
