"""Fixtures of the training tests: the SFT rows of a REAL exported dataset (curation's build
from the fixture warehouse) and their training turns."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from curation.build import build_dataset
from curation.recipe import parse_recipe
from tests.curation.fixture import build_fixture_warehouse
from training.interface import Turn
from warehouse import Warehouse, WarehouseConfig

RECIPE = """
name: vlm-sft
sources: {splits: [train]}
filters: [{drop_invalid_steps: {noop: false}}]
output: {sft: true, k_images: 2}
"""


def turn_of(row: dict[str, Any]) -> Turn:
    """An exported SFT row (as read from Parquet) → a training Turn."""
    return Turn(
        prompt=row["prompt"],
        completion=row["completion"],
        images=tuple(img["bytes"] for img in row["images"]),
        weight=float(row["weight"]),
        key=f"{row['traj_id']}/{row['step_idx']}",
    )


@pytest.fixture(scope="module")
def rows() -> Iterator[list[dict[str, Any]]]:
    """The SFT rows of a dataset built and exported by curation from the fixture warehouse."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        with Warehouse.open(WarehouseConfig.from_env(home=base / "home", warehouse="")) as wh:
            build_fixture_warehouse(wh)
            ds = build_dataset(
                wh, parse_recipe(RECIPE, "vlm.yaml"), out_dir=base / "out", blobs=wh.blobs
            )
        yield pq.read_table(Path(ds.export_path) / "parquet" / "sft.parquet").to_pylist()


@pytest.fixture(scope="module")
def turns(rows) -> list[Turn]:
    return [turn_of(r) for r in rows]
