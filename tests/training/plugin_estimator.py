"""A user's own advantage estimator, in its own module (what docs/how-to/add-an-estimator.md
shows): imported through ``WEBLOOP_PLUGINS``, it is known to the CLI and the RL stage by name."""

from __future__ import annotations

import polars as pl

from training.advantages import register


@register("mean_baseline")
def mean_baseline(frame: pl.DataFrame, scale: float = 1.0) -> pl.DataFrame:
    """REINFORCE with the batch's mean reward as the baseline, on every turn.

    Columns: ``traj_id``, ``reward`` (the trajectory's, repeated on its turns). ``A(τ) = scale ·
    (R(τ) − mean_τ' R(τ'))``, the mean over trajectories (each counts once)."""
    per_traj = frame.group_by("traj_id").agg(pl.col("reward").first().cast(pl.Float64))
    mean = per_traj["reward"].mean()
    return frame.with_columns(advantage=scale * (pl.col("reward").cast(pl.Float64) - mean))
