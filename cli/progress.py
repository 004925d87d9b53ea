"""A live progress bar (``rich.progress``) with counts and rates for the CLI's long commands.

One :class:`LiveProgress` is the ``progress`` / ``on_progress`` callback of a stage flow. It takes
whatever that stage reports, as it reports it:

* ``rollouts.engine.Stats`` (collect, evaluate, RL collection): episodes finished of the total,
  running, successful / not successful, steps, steps/s and episodes/s;
* ``judging.base.JudgeSummary`` (judge): trajectories judged, verdict counts, judge errors,
  trajectories/s;
* ``judging.prm.ScoreSummary`` (score-steps): states scored, candidates scored, scorer errors,
  states/s;
* the summary ``dict`` of intervene (``selected``, ``skipped``, ``intervened``, ``verified`` …):
  trajectories done of those selected and not skipped, verified / not verified / no error
  found / errors, trajectories/s;
* a ``str`` (curate's and train's stage lines): printed above the bar;
* :meth:`LiveProgress.steps` ``(done, total)`` (the trainer's step counter): steps, steps/s.

Rates are counts over the time since the bar started (an injectable clock, so tests see fixed
rates). On a terminal the bar redraws in place (at most ``refresh_per_s`` times a second); when
the output is not a terminal (a log file, CI) it prints the same line every ``log_every_s``
seconds and at the end, in place of the old 5-second prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from cli.terminal import SafeConsole


class LiveProgress:
    """A live bar for one command; use it as a context manager and pass it as the callback."""

    def __init__(
        self,
        label: str,
        *,
        console: Console | None = None,
        total: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_per_s: float = 4.0,
        log_every_s: float = 5.0,
    ) -> None:
        self.label = label
        self.console = console or SafeConsole()
        self.clock = clock
        self.started = clock()
        self.total = total
        self.completed = 0
        self.text = "starting"
        self.live = self.console.is_terminal
        self.refresh_every = 1.0 / refresh_per_s
        self.log_every_s = log_every_s
        self._last_draw = float("-inf")
        self._last_log = float("-inf")
        self._logged_text: str | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    # -- context ---------------------------------------------------------------------------------

    def __enter__(self) -> LiveProgress:
        self.started = self.clock()
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[text]}"),
                console=self.console,
                auto_refresh=False,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                self.label, total=self.total, completed=0, text=self.text
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._draw(force=True)
            self._progress.stop()
            self._progress = None
        elif self._logged_text != self.text and self.text != "starting":
            self.console.print(self.line(), soft_wrap=True)

    # -- callbacks -------------------------------------------------------------------------------

    def __call__(self, update: Any) -> None:
        """The stage's progress report (see the module docstring for the shapes taken)."""
        if isinstance(update, str):
            self.console.print(update, soft_wrap=True)
            return
        completed, total, text = describe(update, self.elapsed())
        self.update(completed, total, text)

    def steps(self, done: int, total: int) -> None:
        """The trainer's step counter: ``done`` optimiser steps of ``total``."""
        rate = done / self.elapsed()
        self.update(done, total, f"step {done}/{total} · {rate:.2f} steps/s")

    def update(self, completed: int, total: int | None, text: str) -> None:
        """Set the bar to ``completed`` of ``total`` (None: unknown) with ``text`` beside it."""
        self.completed, self.total, self.text = completed, total, text
        finished = total is not None and completed >= total
        if self._progress is not None:
            self._draw(force=finished)
            return
        now = self.clock()
        if finished or now - self._last_log >= self.log_every_s:
            self._last_log = now
            self._logged_text = text
            self.console.print(self.line(), soft_wrap=True)

    # -- rendering -------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return max(self.clock() - self.started, 1e-9)

    def line(self) -> str:
        """The bar's text as one plain line (what a non-terminal gets)."""
        return f"  {self.label}: {self.text}"

    def _draw(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_draw < self.refresh_every:
            return
        self._last_draw = now
        assert self._progress is not None and self._task is not None
        self._progress.update(
            self._task, total=self.total, completed=self.completed, text=self.text
        )
        self._progress.refresh()


def describe(update: Any, elapsed: float) -> tuple[int, int | None, str]:
    """(completed, total or None, counts-and-rates text) of one progress report."""
    if isinstance(update, Mapping):
        return _intervene(update, elapsed)
    if hasattr(update, "finished") and hasattr(update, "by_status"):
        return _engine(update, elapsed)
    if hasattr(update, "judged") and hasattr(update, "verdicts"):
        return _judge(update, elapsed)
    if hasattr(update, "states") and hasattr(update, "scored"):
        return _score(update, elapsed)
    raise TypeError(f"LiveProgress cannot show a {type(update).__name__} progress report")


def _engine(st: Any, elapsed: float) -> tuple[int, int | None, str]:
    ok = st.by_status.get("success", 0)
    not_ok = sum(v for k, v in st.by_status.items() if k != "success")
    text = (
        f"{st.finished}/{st.total} episodes · {st.running} running · {ok} successful · "
        f"{not_ok} not successful · {st.steps} steps · {st.steps / elapsed:.1f} steps/s · "
        f"{st.finished / elapsed:.2f} episodes/s"
    )
    return st.finished, st.total, text


def _judge(s: Any, elapsed: float) -> tuple[int, int | None, str]:
    verdicts = ", ".join(f"{k} {v}" for k, v in sorted(s.verdicts.items())) or "no verdicts"
    text = (
        f"{s.judged} judged ({verdicts}) · {s.errors} judge errors · "
        f"{s.judged / elapsed:.2f} trajectories/s"
    )
    return s.judged, None, text


def _score(s: Any, elapsed: float) -> tuple[int, int | None, str]:
    text = (
        f"{s.states} states · {s.scored}/{s.candidates} candidates scored · "
        f"{s.errors} scorer errors · {s.states / elapsed:.2f} states/s"
    )
    return s.states, None, text


def _intervene(s: Mapping[str, Any], elapsed: float) -> tuple[int, int | None, str]:
    missing = [k for k in ("selected", "intervened", "verified", "no_error_found", "errors")
               if k not in s]  # fmt: skip
    if missing:
        raise TypeError(f"an intervene progress summary lacks {', '.join(missing)}")
    done = s["intervened"] + s["no_error_found"] + s["errors"]
    total = s["selected"] - len(s.get("skipped") or ())  # skipped ones are never tried
    text = (
        f"{done}/{total} trajectories · {s['verified']} verified · "
        f"{s.get('not_verified', 0)} not verified · {s['no_error_found']} no error found · "
        f"{s['errors']} errors · {done / elapsed:.2f} trajectories/s"
    )
    return done, total, text
