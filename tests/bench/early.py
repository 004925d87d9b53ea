"""The ``--quick`` benchmarks of the suite, started when the session begins.

Each benchmark runs as a subprocess of its own (its servers, browsers and warehouse), and the rest
of the suite keeps about one of the two cores busy: so ``tests/conftest.py`` starts the selected
benchmarks right after collection, one after another in a background thread, and moves their
tests to the end of the run. A test then reads its benchmark's output with :func:`quick` (the run
started early, or one started now when there is none: ``pytest tests/bench/…`` alone, or under
pytest-xdist). The benchmarks and what the tests assert on their output are unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).parents[2]


def argv(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / script), "--quick", *args]


class _Early:
    """Benchmark runs started in a background thread, one at a time, in the order given."""

    def __init__(self, runs: list[tuple[str, ...]]) -> None:
        self.runs = runs
        self.done: dict[tuple[str, ...], subprocess.CompletedProcess] = {}
        self.events = {r: threading.Event() for r in runs}
        self.current: subprocess.Popen | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._go, name="quick-benches", daemon=True)

    def _go(self) -> None:
        for run in self.runs:
            try:
                if not self.stopped:
                    self.done[run] = self._one(run)
            finally:
                self.events[run].set()

    def _one(self, run: tuple[str, ...]) -> subprocess.CompletedProcess:
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            self.current = subprocess.Popen(
                argv(*run), cwd=ROOT, stdout=out, stderr=err, text=True, env={**os.environ}
            )
            rc = self.current.wait()
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(argv(*run), rc, out.read(), err.read())

    def stop(self) -> None:
        self.stopped = True
        if self.current is not None and self.current.poll() is None:
            self.current.kill()


_early: _Early | None = None


def start(runs: list[tuple[str, ...]]) -> None:
    """Start ``runs`` (a script name and its extra arguments each) in the background."""
    global _early
    if _early is None and runs:
        _early = _Early(list(dict.fromkeys(runs)))
        _early.thread.start()


def stop() -> None:
    """Kill a benchmark still running (the session is over)."""
    if _early is not None:
        _early.stop()


def quick(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """The ``--quick`` run of ``bench/<script>`` with ``args``: the one started early, or one run
    now. ``timeout`` bounds the wait (for the early run: from when this test asks for it)."""
    run = (script, *args)
    if _early is not None and run in _early.events:
        if not _early.events[run].wait(timeout):
            raise TimeoutError(f"bench/{script} --quick did not finish in {timeout:.0f} s")
        if run in _early.done:
            return _early.done[run]
    return subprocess.run(argv(*run), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
