"""The demo — the main job of ``make demo``: the :mod:`flows.flywheel` at CPU scale on the
bundled sites.

It starts the sites server and one Chromium (lent to every stage), creates the warehouse,
generates the bundled tasks, collects noisy-expert and untrained-ranker rollouts, judges them,
scores a sample of states with the exact PRM, lets the expert teacher correct a few failures,
curates the successes, trains the ranker (frozen MiniLM + a small scorer) by SFT, evaluates it
on held-out ``test`` tasks, and — in later rounds — collects with the new checkpoint and goes
round again. :func:`summary_lines` says what happened: success before and after with 95% Wilson
intervals, dataset sizes, where the warehouse is, how to open the dashboard and the Prefect UI.

Run again with the same options, it continues an interrupted demo or finds everything done
(the flywheel's stages are idempotent); :func:`demo_state` tells which, before it runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.flywheel import flywheel_flow
from stages.config import load_config, with_settings
from stages.evaluate import delta_method
from stages.flywheel import (
    FlywheelConfig,
    FlywheelResult,
    Lent,
    RoundRecord,
    eval_line,
    flywheel_status,
)

__all__ = ["Lent", "demo_config", "demo_state", "lend", "run_demo", "summary_lines"]


DEMO_PRESET = Path(__file__).parents[1] / "stages" / "presets" / "demo.yaml"


def demo_config(seed: int = 0, rounds: int = 2, **overrides: Any) -> FlywheelConfig:
    """The CPU-scale flywheel: the demo preset (``stages/presets/demo.yaml``) with ``seed``,
    ``rounds`` and any other settings (a nested config's as a mapping: ``rollout={"samples":
    4}``)."""
    cfg = load_config(FlywheelConfig, DEMO_PRESET)
    return with_settings(cfg, {"seed": seed, "rounds": rounds, **overrides})


def demo_state(cfg: FlywheelConfig, home: str | None = None) -> str:
    """``new``, ``interrupted`` (an earlier demo stopped part-way: it continues) or ``done``."""
    status = flywheel_status(cfg, home)
    if status is None:
        return "new"
    return "done" if status == "completed" else "interrupted"


class _Chromium:
    """One Chromium on its own event loop in a background thread (a Playwright browser belongs
    to the loop that launched it); ``run(coro)`` runs a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="chromium")
        self.thread.start()
        self.browser: Any = None
        self._pw: Any = None

    def run(self, coro: Coroutine, timeout: float = 3600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        from rollouts.browser import launch

        self._pw = await async_playwright().start()
        self.browser = await launch(self._pw)

    async def _stop(self) -> None:
        if self.browser is not None:
            await self.browser.close()
        if self._pw is not None:
            await self._pw.stop()

    def close(self) -> None:
        try:
            self.run(self._stop(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


@contextmanager
def lend(site_seed: int = 0) -> Iterator[Lent]:
    """Start the bundled sites (a server process) and one Chromium for the whole demo."""
    from sites.server import SiteServer

    server = SiteServer(seed=site_seed).start()  # a thread: starts in ms, also on a busy machine
    chromium = _Chromium()
    try:
        chromium.run(chromium._start(), timeout=300)
        yield Lent(server, chromium.browser, chromium.run)
    finally:
        try:
            chromium.close()
        finally:
            server.stop()


def run_demo(
    cfg: FlywheelConfig, home: str | None = None, lent: Lent | None = None
) -> FlywheelResult:
    """The demo's flywheel run (lent servers, or its own sites and Chromium started here);
    the flow's result with its ``state``: what was stored before it ran (:func:`demo_state`)."""
    state = demo_state(cfg, home)
    if lent is not None or state == "done":  # done: no stage has work, none starts anything
        return dataclasses.replace(flywheel_flow(cfg, home, lent), state=state)
    with lend() as own:
        return dataclasses.replace(flywheel_flow(cfg, home, own), state=state)


def corrections_line(intervened: dict[str, Any] | None) -> str:
    """What the round's teacher corrected (nothing when the round ran no interventions)."""
    if not intervened:
        return ""
    if not intervened.get("selected"):
        return f"corrections: none new ({intervened.get('settled', 0)} stored); "
    return (
        f"corrections: {intervened.get('intervened', 0)} of {intervened['selected']} failures "
        f"({intervened.get('verified', 0)} verified); "
    )


def change_line(r: RoundRecord) -> str:
    """The round's change against the round before it (round 1: the untrained ranker)."""
    d = r.delta or {}
    if "diff" not in d:
        return "no comparison with the round before"
    before = "the untrained ranker" if r.round == 1 else f"round {r.round - 1}"
    how = f"paired, {d['a_only']} lost / {d['b_only']} gained" if "a_only" in d else "unpaired"
    return f"{100 * d['diff']:+.1f} points against {before} ({how})"


def summary_lines(out: FlywheelResult) -> list[str]:
    """The demo's closing summary, one line each."""
    where, rounds = out.warehouse, out.rounds
    lines = {
        "new": [],
        "interrupted": ["an earlier demo had stopped part-way: it continued where it stopped"],
        "done": ["found everything done by an earlier demo: nothing was collected or trained"],
    }[out.state or "new"]
    t = where["tasks"]
    lines.append(
        f"bundled suite: {t['generated']} tasks "
        f"({', '.join(f'{k} {v}' for k, v in t.items() if k not in ('generated', 'new'))})"
    )
    for r in rounds:
        col = ", ".join(f"{k} {v.ran + v.skipped} ({v.ran} now)" for k, v in r.collected.items())
        ds = r.dataset
        c = ds["counts"]
        lines.append(
            f"round {r.round}: rollouts {col}; {corrections_line(r.intervened)}"
            f"dataset {ds['name']}: "
            f"{c.get('trajectories', 0)} trajectories, {c.get('sft', 0)} SFT rows; "
            f"checkpoint {r.trained.checkpoint_id} ({r.steps_run} steps now); "
            f"held-out success {eval_line(r.after)}; {change_line(r)}"
        )
    u, f, d = out.untrained, out.final, out.overall
    lines += [
        f"success before (untrained ranker): {eval_line(u)}",
        f"success after ({len(rounds)} round{'s' * (len(rounds) > 1)}): {eval_line(f)}",
        f"difference: {100 * d['diff']:+.1f} points, 95% CI "
        f"[{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}] ({delta_method(d)})",
        f"warehouse: {where['catalog']} (home {where['home']})",
        'look around: webloop dashboard  ·  webloop sql "SELECT * FROM evaluations"  ·  '
        "webloop checkpoints list",
        "Prefect UI (flow runs, the per-round result artifacts): prefect server start, then "
        "open http://127.0.0.1:4200 and run the demo again with "
        "PREFECT_API_URL=http://127.0.0.1:4200/api",
    ]
    return lines
