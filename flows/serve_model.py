"""``webloop serve-model``: a small OpenAI-compatible server over a transformers model.

It lets the ``openai`` policy (and judges) run end to end over real HTTP on machines without
vLLM; in production, vLLM's own server plays this role. Endpoints: ``POST
/v1/chat/completions`` (text + ``data:`` image URLs, ``max_tokens``, ``logprobs``,
``temperature``, ``top_p``, ``seed``; temperature absent or 0: greedy — unlike OpenAI's default
of 1, so callers that send none keep deterministic replies),
``GET /v1/models``, ``GET /health``. Concurrent requests are generated in batches.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollouts.hf import HFGenerator, Sampling, completion_body, load_model


def build_app(model_path: str, name: str | None = None, max_batch: int = 8) -> Starlette:
    model, proc = load_model(model_path)
    gen = HFGenerator(model, proc, max_batch=max_batch)
    served = name or model_path

    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            sampling = sampling_of(body)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse(
                {"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}},
                status_code=400,
            )
        try:
            out = await gen.generate(messages, int(body.get("max_tokens") or 64), **sampling)
        except ValueError as exc:
            return JSONResponse(
                {"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400
            )
        return JSONResponse(completion_body(served, out, bool(body.get("logprobs"))))

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "webloop"}]}
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "batches": gen.batches})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )


def sampling_of(body: dict[str, Any]) -> dict[str, Any]:
    """``temperature``, ``top_p`` and ``seed`` of a request body (ValueError when malformed)."""
    out: dict[str, Any] = {}
    for key, kind in (("temperature", float), ("top_p", float), ("seed", int)):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"'{key}' must be a number, got {value!r}")
        if kind is int and value != int(value):
            raise ValueError(f"'{key}' must be an integer, got {value!r}")
        out[key] = kind(value)
    Sampling(out.get("temperature", 0.0), out.get("top_p", 1.0))  # range checks
    return out


def serve(
    model_path: str, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, **kw: Any
) -> None:
    import uvicorn

    uvicorn.run(build_app(model_path, name, **kw), host=host, port=port, log_level="warning")
