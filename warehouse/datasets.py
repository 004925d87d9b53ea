"""What a curated dataset holds, read back from the warehouse: one definition for the curate
flow's artifact and the dashboard's datasets page."""

from __future__ import annotations

from typing import Any

import polars as pl

from warehouse.store import Warehouse

COMPOSITION_SCHEMA = {
    "site": pl.String,
    "split": pl.String,
    "policy": pl.String,
    "trajectories": pl.Int64,
    "steps": pl.Int64,
}
"""The columns of :func:`dataset_composition`'s rows, in order, with their types."""

COMPOSITION_COLUMNS = tuple(COMPOSITION_SCHEMA)


def dataset_composition(wh: Warehouse, dataset_id: str) -> list[dict[str, Any]]:
    """The members of dataset ``dataset_id`` per site, split and policy, sorted by them
    (``warehouse/queries/dataset_composition.sql``).

    Each row: ``site`` (of the task version the trajectory ran), ``split`` (the member's split
    as the dataset stored it: the task's split at build time, ``intervention`` for the state of
    a verified intervention), ``policy``, ``trajectories`` (distinct member trajectories),
    ``steps`` (step members). ``'?'`` where a value is unknown. No rows for an unknown dataset.
    """
    return wh.query("dataset_composition", dataset=dataset_id).to_dicts()
