"""The ``score_steps`` flow: :func:`stages.score_steps.run_score_steps` as a Prefect flow
(sharded across Dask workers when the config asks)."""

from __future__ import annotations

from collections.abc import Callable

from prefect import flow, task

from flows import dask_scale, prefect_env
from judging.prm import ScoreSummary
from stages import score_steps as stage
from stages.score_steps import ScoreStepsConfig, ScoreStepsResult
from warehouse import Warehouse, WarehouseConfig


# The exact scorer drives browsers, the vlm scorer and openai candidates call HTTP: retried
# (a retry skips the states already scored and reuses stored candidates).
@task(
    name="score-candidates",
    retries=dask_scale.RETRIES,
    retry_delay_seconds=dask_scale.RETRY_DELAY_S,
    retry_condition_fn=dask_scale.retry_unless_bad_input,
)
def score_candidates(cfg: ScoreStepsConfig, home: str | None = None) -> ScoreStepsResult:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return stage.run_score_steps(wh, cfg, prefect_env.progress_of("score_steps"))


@flow(name="score_steps")
def score_steps_flow(cfg: ScoreStepsConfig, home: str | None = None) -> ScoreStepsResult:
    """PRM scores and group-relative advantages for candidate actions at visited states
    (sharded across Dask workers when ``cfg.workers`` or ``cfg.dask_address`` is set)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_sharded(stage, cfg, home)
    return score_candidates(cfg, home)


def score_steps(
    cfg: ScoreStepsConfig,
    home: str | None = None,
    on_progress: Callable[[ScoreSummary], None] | None = None,
) -> ScoreStepsResult:
    """Run the score-steps flow; ``on_progress`` gets the running summary (not when sharded)."""
    if dask_scale.sharded(cfg.workers, cfg.dask_address):
        return dask_scale.run_flow(score_steps_flow, cfg.workers, cfg.dask_address, cfg, home)
    with prefect_env.progress_to("score_steps", on_progress):
        return score_steps_flow(cfg, home)
