"""The demo flow — the main job of ``make demo``, as far as the flywheel exists today:

1. create (or upgrade) the warehouse;
2. generate the bundled task suite (rubrics, checkers, reference solutions);
3. collect rollouts in real Chromium with the scripted expert, with injected mistakes so that
   failures exist to learn from (the ``collect`` stage's library code, resumable);
4. judge them with the programmatic judge (the ``judge`` stage: judgments beside any VLM
   judge's, ready for calibration);
5. score candidate actions at a sample of visited states with the exact replay PRM (the
   ``score_steps`` stage: K candidates per state, scores, group-relative advantages);
6. curate a filtered behaviour-cloning dataset (``curation/recipes/filtered-bc.yaml``: judged
   successes, cleaned, deduplicated, quality-gated, exported to ``$WEBLOOP_HOME/datasets``;
   the same data gives the same dataset on a re-run);
7. summarize success by suite / site / split / policy through the warehouse's SQL.

Later stages (train → evaluate) extend it as they land.

By default the collect and score stages start a sites server and browsers of their own, only when
they have work; a caller that already runs both (the test suite) lends them with :class:`Lent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from flows import prefect_env

prefect_env.configure()

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

import curation  # noqa: E402
from flows.collect import CollectConfig, run_collect  # noqa: E402
from flows.curate import build as build_dataset_task  # noqa: E402
from flows.curate import default_out  # noqa: E402
from flows.judge import JudgeConfig, run_judge  # noqa: E402
from flows.score_steps import ScoreStepsConfig, run_score_steps_async  # noqa: E402
from sites.tasks import generate as generate_tasks  # noqa: E402
from warehouse import Warehouse, WarehouseConfig, migrations  # noqa: E402
from warehouse.tasks import put_tasks  # noqa: E402


class Lent:
    """A running bundled-sites server and a launched Playwright Chromium that the caller owns and
    lends to the demo (they stay running after it). The server serves site seed 0 (the bundled
    suite's; the collect and score stages check it).

    ``run(coro)`` runs a coroutine on the browser's event loop and returns its result (a Playwright
    browser belongs to the loop that launched it; tests/conftest.py ``SharedChromium.run``).

    Opaque to Prefect on purpose (``__slots__``, no pickling): as a flow parameter it is stored as
    a placeholder, never serialized (the server's secret stays in this process), and the tasks
    that take it skip Prefect's input-hash cache (idempotency comes from the warehouse)."""

    __slots__ = ("browser", "run", "server")

    def __init__(self, server: Any, browser: Any, run: Callable[[Coroutine], Any]) -> None:
        self.server, self.browser, self.run = server, browser, run

    def __reduce__(self) -> Any:
        raise TypeError("a Lent server and browser are live objects of this process")


def _run(lent: Lent | None, coro_fn: Callable[..., Coroutine]) -> Any:
    """``coro_fn(server=…, browser=…)`` on the lent server and browser (on the browser's loop), or
    ``coro_fn()`` in a fresh event loop (it starts what it needs)."""
    if lent is None:
        return asyncio.run(coro_fn())
    return lent.run(coro_fn(server=lent.server, browser=lent.browser))


@task(retries=2, retry_delay_seconds=1)
def prepare_warehouse(home: str | None) -> dict[str, Any]:
    """Create or upgrade the warehouse; return where it lives and its schema version."""
    cfg = WarehouseConfig.from_env(home=home)
    with Warehouse.open(cfg) as wh:
        return {"catalog": cfg.describe(), "schema_version": migrations.current_version(wh.con)}


@task(retries=2, retry_delay_seconds=1)
def generate_bundled_tasks(home: str | None, n: int, seed: int) -> dict[str, int]:
    """The bundled suite (rubrics, checkers, reference solutions) into the warehouse."""
    tasks = generate_tasks(n, seed)
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        rep = put_tasks(wh, tasks)
    by_split: dict[str, int] = {}
    for t in tasks:
        by_split[t.split or "?"] = by_split.get(t.split or "?", 0) + 1
    return {"generated": len(tasks), "new": len(rep.new), **by_split}


@task(retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def collect_expert_rollouts(
    home: str | None, cfg: CollectConfig, lent: Lent | None = None
) -> dict[str, Any]:
    """Expert rollouts with mistakes, in real Chromium; a retry resumes the same run."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return _run(lent, lambda **kw: run_collect(wh, cfg, **kw))


@task(retries=1, retry_delay_seconds=2)
def judge_rollouts(home: str | None, run_id: str) -> dict[str, Any]:
    """The programmatic judge over the run's backlog (idempotent)."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return run_judge(wh, JudgeConfig(judge="programmatic", run=run_id))


@task(retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def score_steps_exact(
    home: str | None, cfg: ScoreStepsConfig, lent: Lent | None = None
) -> dict[str, Any]:
    """Exact PRM scores of K candidates at sampled states (resumes: scored states are kept)."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return _run(lent, lambda **kw: run_score_steps_async(wh, cfg, **kw))


DEMO_RECIPE = Path(curation.__file__).parent / "recipes" / "filtered-bc.yaml"


@task(retries=1, retry_delay_seconds=2)
def curate_dataset(home: str | None) -> dict[str, Any]:
    """Filtered behaviour cloning from the judged rollouts: a versioned, gated SFT dataset."""
    return build_dataset_task.fn(str(DEMO_RECIPE), str(default_out(home)), None, home)


@task
def summarize(home: str | None) -> list[dict[str, Any]]:
    """Success by suite/site/split/policy, through the warehouse's SQL query."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return wh.query("success_by").to_dicts()


@flow(name="demo", log_prints=True)
def demo_flow(
    home: str | None = None,
    seed: int = 0,
    bundled_tasks: int = 200,
    collect_tasks: int = 8,
    samples: int = 2,
    noise: float = 0.15,
    concurrency: int = 4,
    prm_states: int = 12,
    prm_k: int = 3,
    lent: Lent | None = None,
) -> dict[str, Any]:
    """Warehouse → bundled tasks → expert rollouts (with mistakes) → programmatic judgments →
    exact PRM scores at sampled states → SQL summary. ``lent``: a sites server and a Chromium to
    use instead of starting them (:class:`Lent`)."""
    where = prepare_warehouse(home)
    suite = generate_bundled_tasks(home, bundled_tasks, seed)
    cfg = CollectConfig(
        suite="bundled",
        split="train",
        n_tasks=collect_tasks,
        samples=samples,
        policy="expert",
        noise=noise,
        seed=seed,
        # local sites answer in milliseconds: an action whose element is missing (after an
        # injected mistake) need not wait Playwright's usual 10 s
        action_timeout_s=3.0,
        concurrency=concurrency,
        run_name=f"demo-expert-seed{seed}",
    )
    collected = collect_expert_rollouts(home, cfg, lent)
    judged = judge_rollouts(home, collected["run_id"])
    scored = None
    if prm_states:
        prm = ScoreStepsConfig(
            run=collected["run_id"],
            k=prm_k,
            every=3,
            max_states=prm_states,
            seed=seed,
            concurrency=concurrency,
        )
        scored = score_steps_exact(home, prm, lent)
    dataset = curate_dataset(home)
    return {
        "warehouse": where,
        "bundled": suite,
        "collected": collected,
        "judged": judged,
        "scored": scored,
        "dataset": dataset,
        "summary": summarize(home),
    }
