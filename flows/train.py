"""The ``train_sft`` and ``train_rl`` flows: :mod:`stages.train` as Prefect flows; each run's
result and metrics are published as a markdown artifact."""

from __future__ import annotations

import asyncio

from prefect import flow, task

from flows import prefect_env
from flows.artifacts import artifact_key, publish
from stages import train as stage
from stages.train import Progress, RLConfig, SFTConfig
from warehouse import Warehouse, WarehouseConfig


def publish_training(wh: Warehouse, kind: str, res: stage.TrainResult) -> None:
    run_id = res.training_run_id
    publish(
        artifact_key("training", kind),
        stage.training_markdown(kind, res, stage.metrics_summary(wh, run_id) if run_id else []),
        f"{kind} training run {run_id or '(no update)'}",
    )


@task(name="train-sft")
def train_sft_task(cfg: SFTConfig, home: str | None = None) -> stage.TrainResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = stage.run_sft(wh, cfg, prefect_env.progress_of("train"))
        publish_training(wh, "sft", res)
        return res


@flow(name="train_sft")
def train_sft_flow(cfg: SFTConfig, home: str | None = None) -> stage.TrainResult:
    """Supervised fine-tuning on a curated dataset; checkpoints registered in the warehouse."""
    return train_sft_task(cfg, home)


@task(name="train-rl")
def train_rl_task(cfg: RLConfig, home: str | None = None) -> stage.TrainResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = asyncio.run(stage.run_rl(wh, cfg, prefect_env.progress_of("train")))
        publish_training(wh, "rl", res)
        return res


@flow(name="train_rl")
def train_rl_flow(cfg: RLConfig, home: str | None = None) -> stage.TrainResult:
    """On-policy multi-turn RL iterations from a checkpoint."""
    return train_rl_task(cfg, home)


def train_sft(
    cfg: SFTConfig, home: str | None = None, on_progress: Progress | None = None
) -> stage.TrainResult:
    with prefect_env.progress_to("train", on_progress):
        return train_sft_flow(cfg, home)


def train_rl(
    cfg: RLConfig, home: str | None = None, on_progress: Progress | None = None
) -> stage.TrainResult:
    with prefect_env.progress_to("train", on_progress):
        return train_rl_flow(cfg, home)
