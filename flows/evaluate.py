"""The ``evaluate`` flow: a policy (or a checkpoint) on a split's tasks, graded, summarised with
95% Wilson intervals per site and difficulty, stored in ``evaluations``.

Thin: the rollouts are a collect run (resumable, so a re-run continues and then re-summarises
the same trajectories into the same evaluation id); the summary is ``training.evaluate``.
A checkpoint is run by the rollout policy its folder is for (``ranker`` or ``hf``); text-only
policies observe the accessibility tree only (no screenshots are captured: fast).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import prefect_env

prefect_env.configure()

from prefect import flow, task  # noqa: E402

from flows.collect import CollectConfig, run_collect  # noqa: E402
from training.evaluate import record  # noqa: E402
from training.load import resolve_policy  # noqa: E402
from warehouse import Warehouse, WarehouseConfig  # noqa: E402


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate. ``checkpoint``: a checkpoint id, training run id or folder (for the
    ``ranker`` / ``hf`` policies); ``model``/``base_url``: the ``openai`` policy's endpoint."""

    policy: str = "ranker"
    checkpoint: str | None = None
    split: str = "test"
    n: int = 100
    suite: str = "bundled"
    samples: int = 1
    temperature: float = 0.0
    max_steps: int = 30
    seed: int = 0
    site_seed: int = 0
    prompt_mode: str | None = None  # None: the policy's own (a11y for the ranker)
    base_url: str | None = None
    model: str | None = None
    action_timeout_s: float = 3.0
    concurrency: int = 8


def collect_config(cfg: EvalConfig, model: str | None, prompt_mode: str) -> CollectConfig:
    """The collect run an evaluation rolls out (its id names the evaluation)."""
    return CollectConfig(
        suite=cfg.suite,
        split=cfg.split,
        n_tasks=cfg.n,
        samples=cfg.samples,
        policy=cfg.policy,
        base_url=cfg.base_url,
        model=model,
        max_steps=cfg.max_steps,
        action_timeout_s=cfg.action_timeout_s,
        seed=cfg.seed,
        site_seed=cfg.site_seed,
        prompt_mode=prompt_mode,
        temperature=cfg.temperature,
        concurrency=cfg.concurrency,
    )


async def run_evaluation(
    wh: Warehouse,
    cfg: EvalConfig,
    on_progress: Callable[[Any], None] | None = None,
    *,
    server: Any = None,
    browser: Any = None,
) -> dict[str, Any]:
    """Roll out, grade and summarise; the stored evaluation as a dict plus the summary."""
    policy = resolve_policy(wh, cfg.policy, cfg.checkpoint, cfg.model, cfg.prompt_mode)
    coll = collect_config(cfg, policy.model, policy.prompt_mode)
    res = await run_collect(wh, coll, on_progress, server=server, browser=browser)
    ev, summary = record(
        wh,
        res["run_id"],
        suite=cfg.suite,
        split=cfg.split,
        policy=cfg.policy,
        checkpoint_id=policy.checkpoint_id,
        extra={"config": dataclasses.asdict(cfg)},
    )
    return {**dataclasses.asdict(ev), "summary": dataclasses.asdict(summary), "collect": res}


@task(name="evaluate-policy")
def evaluate_policy(cfg: EvalConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return asyncio.run(run_evaluation(wh, cfg, prefect_env.progress_of("evaluate")))


@flow(name="evaluate")
def evaluate_flow(cfg: EvalConfig, home: str | None = None) -> dict[str, Any]:
    """Evaluate a policy on a split; the result is stored in ``evaluations``."""
    return evaluate_policy(cfg, home)


def evaluate(
    cfg: EvalConfig, home: str | Path | None = None, on_progress: Callable | None = None
) -> dict[str, Any]:
    """Run the evaluate flow; ``on_progress`` receives engine stats about once a second."""
    with prefect_env.progress_to("evaluate", on_progress):
        return evaluate_flow(cfg, str(home) if home is not None else None)
