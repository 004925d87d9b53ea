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
from dataclasses import dataclass, field, replace

from rollouts.engine import Finished
from warehouse.blobs import NotAnImageError
from warehouse.images import media_type
from warehouse.records import Blob, Trajectory
from warehouse.store import Warehouse


@dataclass
class WriterStats:
    trajectories: int = 0
    steps: int = 0
    transactions: int = 0
    blobs_new: int = 0
    screenshots_rejected: int = 0  # not images: not stored, their steps keep no screenshot
    rejections: list[str] = field(default_factory=list)  # the first few reasons


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
        blobs: dict[str, Blob] = {}
        rejected: set[str] = set()
        for done in batch:
            shots = _screenshot_hashes(done)
            for digest, data in done.blobs.items():
                if digest in blobs or digest in rejected:
                    continue
                if digest in shots:  # a screenshot must be an image (Chromium's always are)
                    try:
                        put = self.wh.blobs.put_image(data)
                    except NotAnImageError as exc:
                        rejected.add(digest)
                        self.stats.screenshots_rejected += 1
                        if len(self.stats.rejections) < 20:
                            self.stats.rejections.append(f"{done.trajectory.traj_id}: {exc}")
                        continue
                else:
                    put = self.wh.blobs.put(data)
                self.stats.blobs_new += put.new
                blobs[digest] = Blob(hash=put.hash, size=put.size, media_type=_media(data))
        trajs = [_without(d.trajectory, rejected) for d in batch]
        steps = [
            replace(s, screenshot_hash=None) if s.screenshot_hash in rejected else s
            for d in batch
            for s in d.steps
        ]
        self.wh.write_trajectories(trajs, steps, extra=[(list(blobs.values()), Blob)])
        self.stats.trajectories += len(trajs)
        self.stats.steps += len(steps)
        self.stats.transactions += 1

    def _write_each(self, batch: list[Finished]) -> None:
        """After a failed batch: try trajectory by trajectory so that the good ones land."""
        for done in batch:
            with contextlib.suppress(Exception):
                self._write([done])


def _screenshot_hashes(done: Finished) -> set[str]:
    """The blobs of ``done`` that are screenshots (per step, and the final one)."""
    shots = {s.screenshot_hash for s in done.steps if s.screenshot_hash}
    final = (done.trajectory.meta or {}).get("final_screenshot")
    if isinstance(final, str):
        shots.add(final)
    return shots


def _without(traj: Trajectory, rejected: set[str]) -> Trajectory:
    """``traj`` without a reference to a rejected final screenshot."""
    meta = traj.meta or {}
    if meta.get("final_screenshot") in rejected:
        return replace(traj, meta={**meta, "final_screenshot": None})
    return traj


def _media(data: bytes) -> str:
    return media_type(data) or "text/plain; charset=utf-8"
