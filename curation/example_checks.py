"""The small frames the quality gates read about rendered examples (:mod:`curation.gates`).

Per trajectory, whether its stored steps are ``0..n-1`` (:func:`step_index`); per kept step,
whether its recorded action parses (:func:`step_checks`); per example, whether its target
parses in the action grammar (:func:`target_check`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from rollouts.actions import ParseError, parse_action


def step_index(trajs: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """Per trajectory: stored n_steps, step rows, min/max index, and whether 0..n-1 all exist."""
    base = trajs.select("traj_id", pl.col("n_steps").cast(pl.Int64))
    if steps is None or steps.is_empty():
        agg = pl.DataFrame(
            schema={"traj_id": pl.Utf8, "count": pl.Int64, "min_idx": pl.Int64, "max_idx": pl.Int64}
        )
    else:
        agg = steps.group_by("traj_id").agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("step_idx").min().cast(pl.Int64).alias("min_idx"),
            pl.col("step_idx").max().cast(pl.Int64).alias("max_idx"),
        )
    df = base.join(agg, on="traj_id", how="left").with_columns(pl.col("count").fill_null(0))
    contiguous = (pl.col("count") == pl.col("n_steps")) & (
        (pl.col("count") == 0)
        | ((pl.col("min_idx") == 0) & (pl.col("max_idx") == pl.col("count") - 1))
    )
    return df.with_columns(contiguous.alias("contiguous"))


def step_checks(steps: pl.DataFrame | None, kept: pl.DataFrame) -> pl.DataFrame:
    """Kept steps of this chunk with their recorded action and whether it parses."""
    schema = {"traj_id": pl.Utf8, "step_idx": pl.Int64, "action_text": pl.Utf8}
    if steps is None or steps.is_empty():
        return pl.DataFrame(schema={**schema, "parses": pl.Boolean})
    rows = steps.select("traj_id", pl.col("step_idx").cast(pl.Int64), "action_text").join(
        kept.select("traj_id", pl.col("step_idx").cast(pl.Int64)), on=["traj_id", "step_idx"]
    )
    texts = rows.get_column("action_text").unique().drop_nulls().to_list()  # parse each once
    ok = [t for t in texts if not isinstance(parse_action(t), ParseError)]
    parses = pl.col("action_text").is_in(pl.Series(ok, dtype=pl.Utf8).implode()).fill_null(False)
    return rows.with_columns(parses.alias("parses"))


def target_check(row: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_action(row["completion"] or "")
    return {
        "example_id": row["example_id"],
        "kind": row["kind"],
        "completion": row["completion"],
        "parses": not isinstance(parsed, ParseError),
    }
