"""The OpenAI-compatible chat-completions client shared by policies, judges and PRM scorers.

One HTTP client per user: ``POST {base_url}/chat/completions`` with retries and jittered
exponential backoff (:mod:`warehouse.retry`) on 5xx, timeouts, resets and replies that are not a
completion; 4xx answers (bad request, auth) are refused at once. The API key comes from
``WEBLOOP_API_KEY`` or ``OPENAI_API_KEY`` only; it is sent as a header and never stored, logged
or exported.
"""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import httpx

from warehouse.retry import aretrying
from warehouse.secrets import has_url_credentials, redact

MAX_IN_FLIGHT = 32  # requests in flight per client (more wait their turn)


class ModelUnavailable(RuntimeError):
    """The model server could not answer (after retries), or refused the request."""


class _Retry(Exception):
    """An answer worth another try (a 5xx, a reply without choices)."""


def api_key() -> str | None:
    """The API key, from the environment only (never stored, logged or exported)."""
    return os.environ.get("WEBLOOP_API_KEY") or os.environ.get("OPENAI_API_KEY")


class ChatClient:
    """Chat completions against one OpenAI-compatible server (vLLM, a provider, serve-model)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        if has_url_credentials(base_url):
            raise ValueError(
                f"the model server URL {redact(base_url)} holds credentials: pass the key in "
                "WEBLOOP_API_KEY (or OPENAI_API_KEY), the URL without user:password@"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {api_key()}"} if api_key() else {}
            limits = httpx.Limits(
                max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT
            )
            self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout_s, limits=limits)
        return self._client

    async def complete(self, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """The completion body for ``messages``; ``options`` (temperature, max_tokens, logprobs,
        …) go into the request. Raises :class:`ModelUnavailable` when retries are spent."""
        payload: dict[str, Any] = {"model": self.model, "messages": messages, **options}
        policy = aretrying(
            attempts=self.retries + 1,
            retry_on=(httpx.TransportError, ValueError, _Retry),
            base_delay=self.backoff_s,
        )
        try:
            return await policy(self._post, payload)
        except _Retry as exc:
            last = str(exc)
        except (httpx.TransportError, ValueError) as exc:  # timeouts, resets, bad JSON
            last = f"{type(exc).__name__}: {exc}"[:200]
        raise ModelUnavailable(
            f"model server at {self.base_url} failed {self.retries + 1} times; last: {last}"
        )

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One request: the body of a completion, :class:`_Retry` for an answer worth another
        try (5xx, a reply without choices), :class:`ModelUnavailable` for a refusal (4xx)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        async with self._slots:  # queue here: httpcore's own queue is costly when long
            r = await self._http().post(f"{self.base_url}/chat/completions", json=payload)
        if r.status_code in (400, 401, 403, 404, 422):
            raise ModelUnavailable(
                f"model server refused the request: HTTP {r.status_code} {redact(r.text)[:200]}"
            )
        if r.status_code != 200:
            raise _Retry(f"HTTP {r.status_code}")
        body = r.json()
        if not (isinstance(body, dict) and body.get("choices")):
            raise _Retry("a reply without choices")
        return body

    async def text(self, messages: list[dict[str, Any]], **options: Any) -> str:
        """The first choice's message text ("" when the server sent none)."""
        body = await self.complete(messages, **options)
        return message_text(body["choices"][0])

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def message_text(choice: dict[str, Any]) -> str:
    text = (choice.get("message") or {}).get("content") or ""
    return text if isinstance(text, str) else str(text)


def sampled_tokens(choice: dict[str, Any]) -> tuple[list[int], list[float]] | None:
    """The reply's token ids and log-probs from a choice's ``logprobs`` when the server named
    its tokens by id (``return_tokens_as_token_ids``: vLLM and webloop's ``hf`` engine write
    ``token_id:N``); None when it did not (no log-probs, tokens named by their text, or a token
    without a numeric log-prob)."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content:
        return None
    ids, lps = [], []
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token.removeprefix("token_id:")))
        except ValueError:
            return None
        if not isinstance(lp, int | float):
            return None  # (a token without its log-prob: not a reply parity can check)
        lps.append(float(lp))
    return ids, lps


def image_part(png: bytes) -> dict[str, Any]:
    """An image content part (data URL) for a chat message."""
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }
