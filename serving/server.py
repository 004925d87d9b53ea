"""The ``hf`` engine of ``webloop serve-model``: an OpenAI-compatible server over a transformers
model, for machines without vLLM (``--engine vllm`` runs vLLM's own server instead, see
:mod:`serving.supervisor`).

It speaks the protocol the way stock clients (the ``openai`` package) use it:

- ``POST /v1/chat/completions`` (text + ``data:`` image URLs) and ``POST /v1/completions`` (raw
  text prompts, a string or a list of strings, no chat template);
- ``n`` samples per prompt (1-16; with a ``seed``, sample ``i`` is seeded ``seed + i``);
- ``stream=True``: server-sent events, one chunk per token, ``data: [DONE]`` at the end
  (``stream_options.include_usage`` adds a usage chunk). The reply is generated in a batch with
  the other requests first, then streamed: the chunks are correct, the first one is not early;
- ``finish_reason``: ``length`` when ``max_tokens`` cut the reply, ``stop`` when the model ended
  it or a ``stop`` string did;
- ``temperature`` / ``top_p`` / ``seed``: seeded per-request sampling (absent temperature or 0:
  greedy, unlike OpenAI's default of 1, so callers that send none keep deterministic replies);
- ``logprobs`` of the chosen tokens (chat: ``logprobs=true``; completions: ``logprobs=0``);
- a 400 with an ``invalid_request_error`` naming the parameter for everything else it cannot
  honour (tools, response formats, penalties, logit bias, top alternatives, echo, ...);
- ``GET /v1/models``, ``GET /health``;
- vLLM's ``return_tokens_as_token_ids`` (chat log-probs name tokens ``token_id:N``, so a trainer
  can score exactly the tokens the server chose);
- with ``--dev-mode`` (as vLLM's ``VLLM_SERVER_DEV_MODE``; loopback only), vLLM's weight-sync
  call: ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
  loads checkpoint DIR in place (same port; requests in flight finish on the old weights).
  It sits behind :class:`serving.standalone.devguard.DevGuard`: the bearer token of
  ``$WEBLOOP_RELOAD_TOKEN`` (the supervisor draws one per launch), no ``Origin``, the bound
  ``Host``, ``application/json``, and DIR inside ``--reload-root`` (default: the model's parent
  folder). Without ``--dev-mode`` the path does not exist (404).

``python -m serving.server --model DIR --port N`` runs it (the supervisor starts it so).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollouts.hf import Generation, HFGenerator, Sampling, load_model
from serving.standalone.devguard import (
    MIN_TOKEN_CHARS,
    TOKEN_ENV,
    DevGuard,
    host_header,
    is_loopback,
)

MAX_N = 16
#: Per-request caps: a request past one is refused before the model sees it (413 for the body,
#: 400 otherwise). Images are decoded under the warehouse's pixel budget (rollouts/hf.py).
MAX_BODY_BYTES = 64 << 20
MAX_IMAGES = 16
MAX_PROMPT_CHARS = 256_000
# parameters with the value that means "not used"; any other value is refused with a 400
_NEUTRAL: dict[str, Any] = {
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "logit_bias": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "top_logprobs": 0,
    "best_of": 1,
    "echo": False,
    "suffix": None,
    "audio": None,
    "prediction": None,
    "parallel_tool_calls": None,
}


class BadRequest(ValueError):
    """A request this server cannot honour (answered with a 400)."""


def _error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    err = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return JSONResponse({"error": err}, status_code=status)


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


def check_supported(body: dict[str, Any]) -> None:
    """Refuse (BadRequest naming the parameter) what this server cannot honour."""
    for key, neutral in _NEUTRAL.items():
        value = body.get(key)
        if value is None or value == neutral or (neutral is None and value in ([], {})):
            continue
        raise BadRequest(f"'{key}' is not supported by this server (got {value!r})")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise BadRequest(f"'response_format' {fmt!r} is not supported (only type 'text')")


def _int(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r}")
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be in [{low}, {high}], got {value}")
    return value


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"'stop' must be a non-empty string or a list of them, got {stop!r}")
    if len(stops) > 4:
        raise BadRequest("'stop' takes at most 4 sequences")
    return stops


def apply_stop(gen: Generation, stops: list[str]) -> Generation:
    """``gen`` cut before the first ``stop`` string (finish_reason ``stop``), tokens included:
    a token whose text crosses the cut stays out."""
    if not stops:
        return gen
    cuts = [gen.text.find(s) for s in stops if s in gen.text]
    if not cuts:
        return gen
    cut, kept, pos = min(cuts), 0, 0
    pieces = gen.pieces or [t for t, _ in gen.token_logprobs]
    for piece in pieces:
        if pos + len(piece) > cut:
            break
        pos, kept = pos + len(piece), kept + 1
    text = gen.text[:cut]
    head = pieces[:kept]
    if pos < cut:  # the cut falls inside a token: its part before the cut still shows
        head = [*head, text[pos:]]
    return Generation(
        text,
        gen.token_logprobs[: len(head)],
        gen.prompt_tokens,
        len(head),
        "stop",
        head,
        gen.token_ids[: len(head)],
        gen.image_spans,
    )


class Params:
    """The generation parameters of one request (validated)."""

    def __init__(self, body: dict[str, Any], default_max: int) -> None:
        check_supported(body)
        try:
            self.sampling = sampling_of(body)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        self.max_tokens = _int({"max_tokens": limit}, "max_tokens", default_max, 1, 4096)
        self.n = _int(body, "n", 1, 1, MAX_N)
        self.stops = _stops(body)
        self.stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise BadRequest(f"'stream_options' must be an object, got {opts!r}")
        self.include_usage = bool(opts.get("include_usage"))

    def seeds(self) -> list[int | None]:
        seed = self.sampling.get("seed")
        return [None if seed is None else seed + i for i in range(self.n)]


async def _generate(gen: HFGenerator, prompt: Any, p: Params) -> list[Generation]:
    """The ``n`` replies to one prompt (generated concurrently, so they share batches)."""
    kw = {k: v for k, v in p.sampling.items() if k != "seed"}
    outs = await asyncio.gather(
        *(gen.generate(prompt, p.max_tokens, seed=s, **kw) for s in p.seeds())
    )
    return [apply_stop(o, p.stops) for o in outs]


def _usage(outs: list[Generation], prompt_tokens: int) -> dict[str, int]:
    done = sum(o.completion_tokens for o in outs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "total_tokens": prompt_tokens + done,
    }


def _chat_logprobs(gen: Generation) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in gen.token_logprobs
        ]
    }


def as_token_ids(gen: Generation) -> Generation:
    """``gen`` with its log-prob tokens named by id (``token_id:N``, vLLM's form)."""
    pairs = [
        (f"token_id:{i}", lp) for i, (_, lp) in zip(gen.token_ids, gen.token_logprobs, strict=True)
    ]
    return dataclasses.replace(gen, token_logprobs=pairs)


def _text_logprobs(gen: Generation) -> dict[str, Any]:
    offsets, pos = [], 0
    for piece in gen.pieces:
        offsets.append(pos)
        pos += len(piece)
    return {
        "tokens": [t for t, _ in gen.token_logprobs],
        "token_logprobs": [lp for _, lp in gen.token_logprobs],
        "top_logprobs": None,
        "text_offset": offsets,
    }


def completion_body(model_name: str, gen: Generation, logprobs: bool) -> dict[str, Any]:
    """An OpenAI chat.completion JSON body for one generation."""
    return chat_body(model_name, [gen], logprobs, gen.prompt_tokens)


def chat_body(
    model: str, outs: list[Generation], logprobs: bool, prompt_tokens: int
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` body with one choice per generation."""
    choices = []
    for i, g in enumerate(outs):
        choice: dict[str, Any] = {
            "index": i,
            "finish_reason": g.finish_reason,
            "message": {"role": "assistant", "content": g.text},
            "logprobs": _chat_logprobs(g) if logprobs else None,
        }
        choices.append(choice)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(outs, prompt_tokens),
    }


def text_body(
    model: str, outs: list[Generation], logprobs: bool, prompt_tokens: int
) -> dict[str, Any]:
    """An OpenAI ``text_completion`` body (choices in prompt order, ``n`` per prompt)."""
    choices = [
        {
            "index": i,
            "text": g.text,
            "finish_reason": g.finish_reason,
            "logprobs": _text_logprobs(g) if logprobs else None,
        }
        for i, g in enumerate(outs)
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(outs, prompt_tokens),
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def chat_chunks(
    model: str, outs: list[Generation], logprobs: bool, p: Params, prompt_tokens: int
) -> AsyncIterator[str]:
    """The ``chat.completion.chunk`` events of finished generations."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse({**head, "object": "chat.completion.chunk", "choices": choices, **extra})

    for i, g in enumerate(outs):
        first = {"role": "assistant", "content": ""}
        yield chunk([{"index": i, "delta": first, "logprobs": None, "finish_reason": None}])
        for k, piece in enumerate(g.pieces):
            lp = None
            if logprobs:
                lp = {"content": _chat_logprobs(g)["content"][k : k + 1]}
            delta = {"content": piece}
            yield chunk([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}])
        yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": g.finish_reason}])
    if p.include_usage:
        yield chunk([], usage=_usage(outs, prompt_tokens))
    yield "data: [DONE]\n\n"


async def text_chunks(
    model: str, outs: list[Generation], logprobs: bool, p: Params, prompt_tokens: int
) -> AsyncIterator[str]:
    """The ``text_completion`` stream events of finished generations."""
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse({**head, "object": "text_completion", "choices": choices, **extra})

    for i, g in enumerate(outs):
        for k, piece in enumerate(g.pieces):
            lp = None
            if logprobs:
                t, v = g.token_logprobs[k]
                lp = {"tokens": [t], "token_logprobs": [v], "top_logprobs": None}
            yield chunk([{"index": i, "text": piece, "logprobs": lp, "finish_reason": None}])
        yield chunk([{"index": i, "text": "", "logprobs": None, "finish_reason": g.finish_reason}])
    if p.include_usage:
        yield chunk([], usage=_usage(outs, prompt_tokens))
    yield "data: [DONE]\n\n"


class TooLarge(BadRequest):
    """A request body past :data:`MAX_BODY_BYTES` (answered with a 413)."""


async def _bounded_body(request: Request) -> bytes:
    """The request body, read no further than :data:`MAX_BODY_BYTES`."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise TooLarge(f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def check_caps(messages: list[Any]) -> None:
    """Refuse a chat request with more than :data:`MAX_IMAGES` images or more than
    :data:`MAX_PROMPT_CHARS` characters of text, naming the cap."""
    images = chars = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for c in parts:
            if isinstance(c, dict) and c.get("type") == "image_url":
                images += 1
            elif isinstance(c, dict):
                chars += len(str(c.get("text") or ""))
    if images > MAX_IMAGES:
        raise BadRequest(f"{images} images in one request: at most {MAX_IMAGES} are accepted")
    if chars > MAX_PROMPT_CHARS:
        raise BadRequest(f"the messages are longer than {MAX_PROMPT_CHARS:,} characters")


def _prompts(body: dict[str, Any]) -> list[str]:
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts:
        raise BadRequest("'prompt' must be a string or a non-empty list of strings")
    if not all(isinstance(x, str) for x in prompts):
        raise BadRequest("'prompt' as token ids is not supported: send text")
    return prompts


def _completion_logprobs(body: dict[str, Any]) -> bool:
    value = body.get("logprobs")
    if value is None or value is False:
        return False
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"'logprobs' must be a non-negative integer, got {value!r}")
    if value > 0:
        raise BadRequest("'logprobs' > 0 (top alternatives) is not supported: use logprobs=0")
    return True


def build_app(
    model_path: str,
    name: str | None = None,
    max_batch: int = 8,
    dev_mode: bool = False,
    guard: dict[str, str] | None = None,
) -> Starlette | DevGuard:
    """The Starlette app serving ``model_path`` under the model name ``name``. ``dev_mode``: with
    the in-place weight reload of ``POST /collective_rpc``, the app wrapped in a
    :class:`DevGuard` of ``guard``'s ``token``, ``host`` (``address:port``) and ``root``."""
    model, proc = load_model(model_path)
    gen = HFGenerator(model, proc, max_batch=max_batch)
    served = name or model_path

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await _bounded_body(request)
        try:
            body = json.loads(raw)
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    async def chat(request: Request) -> Response:
        try:
            body = await body_of(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list")
            check_caps(messages)
            p = Params(body, 64)
            logprobs = bool(body.get("logprobs"))
            outs = await _generate(gen, messages, p)
        except TooLarge as exc:
            return _error(str(exc), status=413)
        except ValueError as exc:  # BadRequest, and the model's refusals (e.g. a bad image)
            return _error(f"bad request: {exc}")
        if body.get("return_tokens_as_token_ids"):
            outs = [as_token_ids(g) for g in outs]
        n_prompt = outs[0].prompt_tokens
        if p.stream:
            return StreamingResponse(
                chat_chunks(served, outs, logprobs, p, n_prompt), media_type="text/event-stream"
            )
        return JSONResponse(chat_body(served, outs, logprobs, n_prompt))

    async def completions(request: Request) -> Response:
        try:
            body = await body_of(request)
            prompts = _prompts(body)
            if sum(map(len, prompts)) > MAX_PROMPT_CHARS:
                raise BadRequest(f"the prompts are longer than {MAX_PROMPT_CHARS:,} characters")
            p = Params(body, 16)
            logprobs = _completion_logprobs(body)
            groups = await asyncio.gather(*(_generate(gen, x, p) for x in prompts))
        except TooLarge as exc:
            return _error(str(exc), status=413)
        except ValueError as exc:
            return _error(f"bad request: {exc}")
        outs = [g for group in groups for g in group]
        n_prompt = sum(group[0].prompt_tokens for group in groups)
        if p.stream:
            return StreamingResponse(
                text_chunks(served, outs, logprobs, p, n_prompt), media_type="text/event-stream"
            )
        return JSONResponse(text_body(served, outs, logprobs, n_prompt))

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "webloop"}]}
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "batches": gen.batches})

    async def collective_rpc(request: Request) -> Response:
        try:
            path = reload_path(await body_of(request))
            model, proc = await asyncio.to_thread(load_model, path)
        except (ValueError, OSError) as exc:
            return _error(f"reload_weights: {exc}")
        gen.swap(model, proc)
        return JSONResponse({"results": [None]})

    dev = [Route("/collective_rpc", collective_rpc, methods=["POST"])] if dev_mode else []
    app = Starlette(
        routes=[
            *dev,
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
        ]
    )
    return DevGuard(app, **(guard or {})) if dev_mode else app


def reload_path(body: dict[str, Any]) -> str:
    """The checkpoint folder of a ``reload_weights`` call (BadRequest for any other call)."""
    if body.get("method") != "reload_weights":
        raise BadRequest(f"only the reload_weights method is served, not {body.get('method')!r}")
    path = (body.get("kwargs") or {}).get("weights_path")
    if not isinstance(path, str) or not (Path(path) / "config.json").is_file():
        raise BadRequest(f"weights_path {path!r} is not a checkpoint folder (no config.json)")
    return path


def serve(
    model_path: str, host: str = "127.0.0.1", port: int = 8000, name: str | None = None, **kw: Any
) -> None:
    """Serve ``model_path`` until interrupted (blocking)."""
    import uvicorn

    uvicorn.run(build_app(model_path, name, **kw), host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> None:
    """``python -m serving.server --model DIR [--host H] [--port N] [--name NAME] [--dev-mode
    [--reload-root DIR]]``; dev mode off loopback, or without ``$WEBLOOP_RELOAD_TOKEN``, is
    refused before the model loads (exit 2)."""
    ap = argparse.ArgumentParser(prog="python -m serving.server", description=__doc__)
    ap.add_argument("--model", required=True, help="checkpoint folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--name", default=None, help="model name clients use")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument(
        "--dev-mode",
        action="store_true",
        help=f"serve POST /collective_rpc (loopback only; the bearer token in ${TOKEN_ENV})",
    )
    ap.add_argument(
        "--reload-root",
        default=None,
        help="reloads from inside this folder only (default: the model's parent folder)",
    )
    a = ap.parse_args(argv)
    guard = None
    if a.dev_mode:
        if not is_loopback(a.host):
            ap.error(f"--dev-mode is served on loopback only, not on {a.host!r}")
        token = os.environ.get(TOKEN_ENV, "")
        if len(token) < MIN_TOKEN_CHARS:
            need = f"{MIN_TOKEN_CHARS}+ characters"
            ap.error(f"--dev-mode needs the reload token ({need}) in ${TOKEN_ENV}")
        root = a.reload_root or str(Path(a.model).absolute().parent)
        guard = {"token": token, "host": host_header(a.host, a.port), "root": root}
    serve(
        a.model,
        host=a.host,
        port=a.port,
        name=a.name,
        max_batch=a.max_batch,
        dev_mode=a.dev_mode,
        guard=guard,
    )


if __name__ == "__main__":
    main()
