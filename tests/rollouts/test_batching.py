"""BatchWorker: concurrent async callers served in batches by one thread, each getting its own
result (or its batch's error); nothing here depends on timing: the first batch is held open
until the others have queued."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollouts.batching import BatchWorker


class Recorder:
    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, requests: list[str]) -> list[str]:
        self.batches.append(list(requests))
        if len(self.batches) == 1:
            self.release.wait(30)  # the first batch runs until the test lets it go
        if self.fail_on in requests:
            raise ValueError(f"bad request {self.fail_on}")
        return [r.upper() for r in requests]


async def _queued(worker: BatchWorker, n: int) -> None:
    """Wait until ``n`` requests are waiting in the worker's queue."""
    while len(worker._queue) < n:
        await asyncio.sleep(0)


async def _behind_a_held_batch(worker: BatchWorker, rec: Recorder, rest: str) -> list:
    """Submit "a" (its batch is held open), then ``rest`` while it runs; release; all results
    (exceptions included), in order."""
    first = asyncio.ensure_future(worker.submit("a"))
    while not rec.batches:
        await asyncio.sleep(0)
    others = [asyncio.ensure_future(worker.submit(x)) for x in rest]
    await _queued(worker, len(rest))
    rec.release.set()
    return await asyncio.gather(first, *others, return_exceptions=True)


def test_requests_that_wait_go_in_one_batch_and_get_their_own_results():
    rec = Recorder()
    worker = BatchWorker(rec, max_batch=8)
    assert asyncio.run(_behind_a_held_batch(worker, rec, "bcdef")) == list("ABCDEF")
    assert rec.batches == [["a"], list("bcdef")]
    assert worker.batches == 2


def test_max_batch_splits_and_an_error_reaches_only_its_batch():
    rec = Recorder(fail_on="c")
    worker = BatchWorker(rec, max_batch=2)
    out = asyncio.run(_behind_a_held_batch(worker, rec, "bcde"))
    assert rec.batches == [["a"], ["b", "c"], ["d", "e"]]
    assert out[0] == "A" and out[3:] == ["D", "E"]
    assert all(isinstance(e, ValueError) and "bad request c" in str(e) for e in out[1:3])


def test_a_cancelled_caller_does_not_stop_the_others_and_close_ends_the_thread():
    rec = Recorder()
    worker = BatchWorker(rec)

    async def main() -> list[str]:
        first = asyncio.ensure_future(worker.submit("a"))
        while not rec.batches:
            await asyncio.sleep(0)
        gone = asyncio.ensure_future(worker.submit("b"))
        kept = asyncio.ensure_future(worker.submit("c"))
        await _queued(worker, 2)
        gone.cancel()
        rec.release.set()
        return [await first, await kept]

    assert asyncio.run(main()) == ["A", "C"]
    thread = worker._thread
    assert thread is not None and thread.is_alive()
    worker.close()
    thread.join(10)
    assert not thread.is_alive()
    assert asyncio.run(worker.submit("d")) == "D"  # a new thread serves later requests
    worker.close()


def test_a_wrong_number_of_results_is_an_error_for_the_callers():
    worker = BatchWorker(lambda reqs: reqs[:-1])
    with pytest.raises(RuntimeError, match="0 results for 1 requests"):
        asyncio.run(worker.submit("a"))
    worker.close()
    with pytest.raises(ValueError):
        BatchWorker(lambda r: r, max_batch=0)
