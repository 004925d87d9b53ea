"""The background batch writer: finished trajectories → blob store + warehouse, off the step path.

The engine hands each finished trajectory to :meth:`BatchWriter.put` (a queue append). A
background task groups them into transactions of at least ``batch_steps`` steps (or whatever
arrived within ``interval_s``), writes screenshots/trees/prompts to the blob store and the rows
with ``Warehouse.write_trajectories`` in a worker thread. Bigger transactions are much cheaper
on DuckLake (see README, benchmarks). :meth:`close` flushes everything that was put.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from rollouts.engine import Finished
from warehouse.records import Blob
from warehouse.store import Warehouse


@dataclass
class WriterStats:
    trajectories: int = 0
    steps: int = 0
    transactions: int = 0
    blobs_new: int = 0


class BatchWriter:
    def __init__(self, wh: Warehouse, *, batch_steps: int = 2000, interval_s: float = 2.0) -> None:
        self.wh = wh
        self.batch_steps, self.interval_s = batch_steps, interval_s
        self.queue: asyncio.Queue[Finished | None] = asyncio.Queue()
        self.stats = WriterStats()
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def start(self) -> BatchWriter:
        self._task = asyncio.create_task(self._loop())
        return self

    async def put(self, done: Finished) -> None:
        if self.error is not None:
            raise RuntimeError(f"the warehouse writer failed: {self.error}") from self.error
        await self.queue.put(done)

    async def close(self) -> WriterStats:
        await self.queue.put(None)
        if self._task is not None:
            await self._task
        if self.error is not None:
            raise RuntimeError(f"the warehouse writer failed: {self.error}") from self.error
        return self.stats

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        pending: list[Finished] = []
        first_at = 0.0
        closing = False
        while not closing:
            wait = (
                self.interval_s
                if not pending
                else max(0.0, first_at + self.interval_s - loop.time())
            )
            try:
                item = await asyncio.wait_for(self.queue.get(), wait)
                if item is None:
                    closing = True
                else:
                    if not pending:
                        first_at = loop.time()
                    pending.append(item)
            except TimeoutError:
                pass
            due = loop.time() - first_at >= self.interval_s
            full = sum(len(p.steps) for p in pending) >= self.batch_steps
            if pending and (full or closing or due):
                batch, pending = pending, []
                try:
                    await asyncio.to_thread(self._write, batch)
                except Exception as exc:  # keep what was collected: report, do not swallow
                    self.error = exc
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self._write_each, batch)
                    return

    def _write(self, batch: list[Finished]) -> None:
        blobs = {}
        for done in batch:
            for digest, data in done.blobs.items():
                if digest not in blobs:
                    put = self.wh.blobs.put(data)
                    self.stats.blobs_new += put.new
                    blobs[digest] = Blob(hash=put.hash, size=put.size, media_type=_media(data))
        trajs = [d.trajectory for d in batch]
        steps = [s for d in batch for s in d.steps]
        self.wh.write_trajectories(trajs, steps, extra=[(list(blobs.values()), Blob)])
        self.stats.trajectories += len(trajs)
        self.stats.steps += len(steps)
        self.stats.transactions += 1

    def _write_each(self, batch: list[Finished]) -> None:
        """After a failed batch: try trajectory by trajectory so that the good ones land."""
        for done in batch:
            with contextlib.suppress(Exception):
                self._write([done])


def _media(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    return "text/plain; charset=utf-8"
