"""The ``evaluate`` and ``evaluate_newest`` flows: :mod:`stages.evaluate` as Prefect flows;
the evaluation, with its deltas to earlier ones, is published as a markdown artifact."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

from prefect import flow, task

from flows import prefect_env
from flows.artifacts import artifact_key, publish
from stages import evaluate as stage
from stages.config import config_from_mapping
from stages.evaluate import EvalConfig
from warehouse import Warehouse, WarehouseConfig


@task(name="evaluate-policy")
def evaluate_policy(cfg: EvalConfig, home: str | None = None) -> stage.EvalResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = asyncio.run(stage.run_evaluation(wh, cfg, prefect_env.progress_of("evaluate")))
        res = dataclasses.replace(res, deltas=stage.evaluation_deltas(wh, res))
    ev = res.evaluation
    publish(
        artifact_key("evaluation", ev.suite, ev.split),
        stage.evaluation_markdown(res),
        f"evaluation {ev.evaluation_id} on {ev.suite}/{ev.split}",
    )
    return res


@flow(name="evaluate")
def evaluate_flow(cfg: EvalConfig, home: str | None = None) -> stage.EvalResult:
    """Evaluate a policy on a split; the result is stored in ``evaluations``."""
    return evaluate_policy(cfg, home)


@task(name="find-newest-checkpoint")
def find_newest_checkpoint(home: str | None = None) -> tuple[str, str]:
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        return stage.newest_checkpoint(wh)


@flow(name="evaluate_newest")
def evaluate_newest_flow(
    split: str = "ood",
    n: int = 100,
    suite: str = "bundled",
    max_steps: int = 30,
    concurrency: int = 8,
    home: str | None = None,
) -> stage.EvalResult:
    """Evaluate the newest registered checkpoint on a split (the nightly schedule)."""
    policy, checkpoint = find_newest_checkpoint(home)
    rollout = {"policy": policy, "suite": suite, "split": split, "n_tasks": n}
    rollout.update(max_steps=max_steps, concurrency=concurrency)
    cfg = config_from_mapping(EvalConfig, {"checkpoint": checkpoint, "rollout": rollout})
    return evaluate_policy(cfg, home)


def evaluate(
    cfg: EvalConfig, home: str | Path | None = None, on_progress: Callable | None = None
) -> stage.EvalResult:
    """Run the evaluate flow; ``on_progress`` receives engine stats about once a second."""
    with prefect_env.progress_to("evaluate", on_progress):
        return evaluate_flow(cfg, str(home) if home is not None else None)
