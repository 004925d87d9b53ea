"""The group-relative advantage (GRPO normalisation), defined once.

It is what ``step_scores.advantage`` stores for the PRM's candidates at a state
(``judging.prm``), what training's ``grpo``, ``step_grpo``, ``step_awr`` and ``turn``
estimators compute (``training.advantages``), and what the dashboard shows for a task group. It
lives in the warehouse, the layer all of them import, because it defines a stored column.

For the values ``x`` of one group ``g`` (the candidates of a state, the samples of a task)::

    A(x) = (x − mean_g) / (std_g + eps)

with ``std_g`` the population standard deviation (ddof = 0) and ``eps`` (default
:data:`EPS`) keeping the division finite. A group whose values are all equal (a group of one
included) has no signal: every ``A`` is exactly 0 — decided by comparing the values, not by
``std > 0``, which floating-point error makes true for seven equal scores of 0.1. Null values
are left out of the mean and the std and get a null advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

EPS = 1e-6
"""Added to the std in the denominator."""


def varies(values: pl.Expr, over: Sequence[str] | None = None) -> pl.Expr:
    """True where the row's group (rows with equal ``over`` columns; all rows when None) holds
    two different non-null values: the groups that carry a signal."""
    hi, lo = values.max(), values.min()
    if over:
        hi, lo = hi.over(list(over)), lo.over(list(over))
    return (hi > lo).fill_null(False)


def group_relative(values: pl.Expr, over: Sequence[str] | None = None, eps: float = EPS) -> pl.Expr:
    """``(x − mean_g) / (std_g + eps)`` per row, ``g`` the row's group (rows with equal
    ``over`` columns; all rows when None), population std; exactly 0 in a group whose values are
    all equal; null where ``x`` is null."""
    mean, std = values.mean(), values.std(ddof=0)
    if over:
        mean, std = mean.over(list(over)), std.over(list(over))
    return (
        pl.when(values.is_null())
        .then(None)
        .when(varies(values, over))
        .then((values - mean) / (std + eps))
        .otherwise(0.0)
        .cast(pl.Float64)
    )


def group_relative_values(values: Sequence[float | None], eps: float = EPS) -> list[float | None]:
    """:func:`group_relative` over one group given as a list (None: no value)."""
    frame = pl.DataFrame({"x": list(values)}, schema={"x": pl.Float64})
    return frame.select(group_relative(pl.col("x"), eps=eps)).to_series().to_list()
