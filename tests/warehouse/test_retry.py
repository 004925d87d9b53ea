"""The one retry policy (warehouse.retry): attempts, what is retried, backoff bounds, hooks."""

from __future__ import annotations

import asyncio
import sqlite3

import duckdb
import pytest
from tenacity import RetryCallState

from warehouse.connection import with_retry
from warehouse.retry import JitteredBackoff, aretrying, retrying


def flaky(failures: int, exc: BaseException):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return len(calls)

    return fn, calls


def test_transient_errors_are_retried_until_success_and_the_hook_runs_before_each_wait():
    fn, calls = flaky(2, KeyError("busy"))
    hooks = []
    hook = lambda: hooks.append(1)  # noqa: E731
    policy = retrying(attempts=5, retry_on=KeyError, base_delay=0.001, on_retry=hook)
    assert policy(fn) == 3
    assert len(calls) == 3 and len(hooks) == 2


def test_the_last_error_is_raised_unchanged_when_attempts_are_spent():
    fn, calls = flaky(10, KeyError("still busy"))
    with pytest.raises(KeyError, match="still busy"):
        retrying(attempts=4, retry_on=KeyError, base_delay=0.001)(fn)
    assert len(calls) == 4


def test_other_errors_are_raised_at_once():
    fn, calls = flaky(10, ValueError("bad"))
    with pytest.raises(ValueError):
        retrying(attempts=4, retry_on=lambda e: "busy" in str(e), base_delay=0.001)(fn)
    assert len(calls) == 1


def test_backoff_is_exponential_capped_and_jittered():
    wait = JitteredBackoff(0.1, max_delay=0.5)

    def delay(failures: int) -> float:
        state = RetryCallState(None, None, (), {})
        state.attempt_number = failures
        return wait(state)

    for failures, nominal in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5)):
        samples = [delay(failures) for _ in range(200)]
        assert all(0.5 * nominal <= d < 1.5 * nominal for d in samples), (failures, samples[:3])
        assert max(samples) - min(samples) > 0.1 * nominal  # jittered, not fixed


def test_async_policy_awaits_a_coroutine_hook():
    settled = []

    async def settle():
        settled.append(1)

    calls = []

    async def fn(x):
        calls.append(x)
        if len(calls) < 3:
            raise OSError("refused")
        return x * 2

    policy = aretrying(attempts=3, retry_on=OSError, base_delay=0.001, on_retry=settle)
    assert asyncio.run(policy(fn, 21)) == 42
    assert len(calls) == 3 and len(settled) == 2


def test_with_retry_keeps_its_contract():
    locked = duckdb.TransactionException("database is locked")
    fn, calls = flaky(3, locked)
    hooks = []
    assert with_retry(fn, what="t", base_delay=0.001, on_retry=lambda: hooks.append(1)) == 4
    assert len(hooks) == 3
    fn, calls = flaky(3, duckdb.CatalogException("no such table"))  # not contention
    with pytest.raises(duckdb.CatalogException):
        with_retry(fn, what="t", base_delay=0.001)
    assert len(calls) == 1
    fn, calls = flaky(99, locked)
    with pytest.raises(duckdb.TransactionException):
        with_retry(fn, what="t", attempts=5, base_delay=0.001)
    assert len(calls) == 5
    fn, calls = flaky(9, sqlite3.OperationalError("database is locked"))  # not a duckdb error
    with pytest.raises(sqlite3.OperationalError):
        with_retry(fn, what="t", base_delay=0.001)
    assert len(calls) == 1
