"""The one retry policy of webloop: jittered exponential backoff over ``tenacity``.

A call is tried at most ``attempts`` times in all. After a failure whose error is transient
(``retry_on``: exception types, or a predicate on the exception) it waits

    min(max_delay, base_delay × factor ** (failures − 1)) × uniform(0.5, 1.5)

(the jitter spreads out processes that collided) and tries again; ``on_retry()`` runs before
each wait. Any other error, and the last one when the attempts are spent, is raised unchanged:
callers turn it into their own error type and message. The warehouse (lock contention), the
sites client (inspection requests), the chat client (model servers), the browser environment
(screenshots) and the judge runner use it; ``warehouse`` imports nothing else of webloop, so
every layer may import this module.

    rows = retrying(attempts=30, retry_on=is_transient, base_delay=0.02, max_delay=1.0)(query)
    body = await aretrying(attempts=3, retry_on=httpx.TransportError, base_delay=0.5)(post, url)
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base

RetryOn = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]


class JitteredBackoff(wait_base):
    """``min(max_delay, base_delay × factor^(n−1)) × uniform(0.5, 1.5)`` before try n + 1."""

    def __init__(self, base_delay: float, max_delay: float = math.inf, factor: float = 2.0):
        self.base_delay, self.max_delay, self.factor = base_delay, max_delay, factor

    def __call__(self, retry_state: RetryCallState) -> float:
        failures = retry_state.attempt_number
        delay = min(self.max_delay, self.base_delay * self.factor ** (failures - 1))
        return delay * (0.5 + random.random())


def _predicate(retry_on: RetryOn) -> Callable[[BaseException], bool]:
    if isinstance(retry_on, type | tuple):
        return lambda exc: isinstance(exc, retry_on)
    return retry_on


def _policy(attempts: int, retry_on: RetryOn, base_delay: float, max_delay: float, factor: float):
    return dict(
        stop=stop_after_attempt(max(1, attempts)),
        wait=JitteredBackoff(base_delay, max_delay, factor),
        retry=retry_if_exception(_predicate(retry_on)),
        reraise=True,
    )


def retrying(
    *,
    attempts: int,
    retry_on: RetryOn,
    base_delay: float,
    max_delay: float = math.inf,
    factor: float = 2.0,
    on_retry: Callable[[], Any] | None = None,
) -> Retrying:
    """The policy for a synchronous call: ``retrying(...)(fn, *args, **kwargs)``."""
    hook = (lambda _state: on_retry()) if on_retry is not None else None
    return Retrying(**_policy(attempts, retry_on, base_delay, max_delay, factor), before_sleep=hook)


def aretrying(
    *,
    attempts: int,
    retry_on: RetryOn,
    base_delay: float,
    max_delay: float = math.inf,
    factor: float = 2.0,
    on_retry: Callable[[], Awaitable[Any] | Any] | None = None,
) -> AsyncRetrying:
    """The policy for a coroutine: ``await aretrying(...)(fn, *args, **kwargs)``; ``on_retry``
    may be a coroutine function (awaited before each wait)."""

    async def hook(_state: RetryCallState) -> None:
        result = on_retry() if on_retry is not None else None
        if inspect.isawaitable(result):
            await result

    return AsyncRetrying(
        **_policy(attempts, retry_on, base_delay, max_delay, factor), before_sleep=hook
    )
