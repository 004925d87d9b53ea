"""One worker thread serving many concurrent async callers in batches.

    worker = BatchWorker(run_batch, max_batch=32)      # run_batch(list[request]) -> list[result]
    result = await worker.submit(request)              # from any event loop

Concurrent rollouts of one policy ask for model work at about the same time; run together, it is
cheaper than one by one (one forward pass over many rows, one encoder call over many texts). A
:class:`BatchWorker` collects the requests that wait, runs ``run_batch`` on them in its daemon
thread (the event loops keep running) and resolves each caller's future with its own result, or
with the batch's exception. Requests that arrive while a batch runs go into the next one;
``wait_s`` > 0 also lets requests that arrive together join the first. A caller's cancellation
only drops its own wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")


@dataclass
class _Waiting:
    request: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class BatchWorker(Generic[Req, Res]):
    """``run_batch(requests) -> results`` (one result per request, in order) for async callers.

    ``max_batch``: most requests per call. ``wait_s``: how long the thread waits after the first
    request of a batch for others to join (0: take what is waiting). ``batches``: calls made."""

    def __init__(
        self,
        run_batch: Callable[[list[Req]], Sequence[Res]],
        *,
        max_batch: int = 32,
        wait_s: float = 0.0,
        name: str = "batch-worker",
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.run_batch, self.max_batch, self.wait_s, self.name = run_batch, max_batch, wait_s, name
        self.batches = 0
        self._queue: list[_Waiting] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    async def submit(self, request: Req) -> Res:
        """The result of ``request``, computed in a batch with the requests waiting with it."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(request, loop.create_future(), loop)
        with self._cv:
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._stop,), daemon=True, name=self.name
                )
                self._thread.start()
            self._queue.append(waiting)
            self._cv.notify()
        return await waiting.future

    def close(self) -> None:
        """End the thread once the requests already submitted are served (a later
        :meth:`submit` starts a new one)."""
        with self._cv:
            if self._thread is not None:
                self._stop.set()
                self._cv.notify_all()
                self._thread = None

    def _serve(self, stop: threading.Event) -> None:
        while True:
            with self._cv:
                while not self._queue and not stop.is_set():
                    self._cv.wait()
                if not self._queue:  # closed, and nothing left to serve
                    return
            if self.wait_s > 0:
                time.sleep(self.wait_s)  # let requests that arrive together join the batch
            with self._cv:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                results = list(self.run_batch([w.request for w in batch]))
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"{self.name}: {len(results)} results for {len(batch)} requests"
                    )
            except Exception as exc:
                for w in batch:
                    _reply(w, None, exc)
            else:
                for w, res in zip(batch, results, strict=True):
                    _reply(w, res, None)
            self.batches += 1


def _reply(w: _Waiting, result: Any, exc: BaseException | None) -> None:
    with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits for it any more
        w.loop.call_soon_threadsafe(_resolve, w.future, result, exc)


def _resolve(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
