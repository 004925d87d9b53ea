"""Export: HF datasets folders + Parquet + data card, byte-identical across builds of the same
recipe and snapshot (also after the warehouse gained rows), loadable with ``datasets``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from curation.build import build_dataset
from curation.examples import sft_messages
from rollouts.prompts import render
from tests.curation.test_examples import engine_warehouse, recipe
from warehouse import Warehouse
from warehouse.records import Trajectory

FILTERS = "[{drop_invalid_steps: {noop: false}}]"  # (the simulated pages never change)


def file_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """One warehouse, two builds at snapshot N, a later write, a third build pinned to N."""
    from warehouse import WarehouseConfig

    base = tmp_path_factory.mktemp("export")
    cfg = WarehouseConfig.from_env(home=base / "home", warehouse="")
    with Warehouse.open(cfg) as wh:
        engine_warehouse(wh)
        r = recipe(filters=FILTERS)
        first = build_dataset(wh, r, out_dir=base / "a", blobs=wh.blobs, progress=None)
        n = first.snapshot_id  # (the first build's pin and registration made new snapshots)
        second = build_dataset(
            wh, r, out_dir=base / "b", snapshot_id=n, blobs=wh.blobs, progress=None
        )
        # the warehouse gains a trajectory after the pinned snapshot
        wh.write(
            [
                Trajectory(
                    traj_id="late",
                    run_id="run-engine",
                    task_id="shop-kettle",
                    policy="openai",
                    status="success",
                    n_steps=0,
                )
            ]
        )
        pinned = build_dataset(
            wh, r, out_dir=base / "c", snapshot_id=n, blobs=wh.blobs, progress=None
        )
        latest = build_dataset(wh, r, out_dir=base / "d", blobs=wh.blobs, progress=None)
        prompts = {
            h: wh.blobs.get(h)
            for h in wh.sql("SELECT prompt_hash FROM steps")["prompt_hash"].to_list()
        }
    return dict(
        first=first, second=second, pinned=pinned, latest=latest, base=base, prompts=prompts
    )


def test_same_recipe_and_snapshot_give_byte_identical_files(built):
    first, second, pinned = built["first"], built["second"], built["pinned"]
    assert first.dataset_id == second.dataset_id == pinned.dataset_id
    a = file_hashes(Path(first.export_path))
    assert set(a) >= {
        "README.md",
        "recipe.json",
        "metadata.json",
        "sft/dataset_info.json",
        "sft/state.json",
        "sft/data-00000-of-00001.arrow",
        "parquet/sft.parquet",
        "rl/data-00000-of-00001.arrow",
        "parquet/preferences.parquet",
    }
    assert a == file_hashes(Path(second.export_path))
    assert a == file_hashes(Path(pinned.export_path))  # built after the warehouse grew


def test_a_later_snapshot_is_another_dataset(built):
    first, latest = built["first"], built["latest"]
    assert latest.snapshot_id > first.snapshot_id
    assert latest.dataset_id != first.dataset_id
    assert latest.counts["trajectories"] == first.counts["trajectories"] + 1
    assert latest.counts["rl"] == first.counts["rl"] + 1  # the late success joins its group


def test_export_loads_with_datasets_and_images_decode(built):
    path = Path(built["first"].export_path)
    sft = datasets.load_from_disk(str(path / "sft"))
    # kettle 2 x 3 steps + oslo 3 steps minus its invalid one = 8
    assert len(sft) == 8
    assert isinstance(sft.features["images"].feature, datasets.Image)
    first_image = sft[0]["images"][0]
    assert first_image.size == (160, 100) and first_image.mode == "RGB"
    raw = sft.cast_column("images", datasets.List(datasets.Image(decode=False)))
    for row in raw:  # re-rendered from the export: the exact stored prompt bytes
        assert render(sft_messages(row)[:-1]).encode() == built["prompts"][row["prompt_hash"]]
    table = pq.read_table(path / "parquet" / "sft.parquet")
    assert table.num_rows == 8 and b"huggingface" in table.schema.metadata
    rl = datasets.load_from_disk(str(path / "rl"))
    assert sorted(rl["reward"]) == [0.0, 1.0, 1.0]


def test_data_card_names_composition_filters_licence_and_provenance(built):
    first = built["first"]
    card = (Path(first.export_path) / "README.md").read_text()
    assert first.data_card == card
    assert f"- warehouse snapshot (pinned): {first.snapshot_id}" in card
    assert f"- recipe sha256: `{first.recipe_hash}`" in card
    assert "| shop | train | openai | 2 | 6 |" in card  # site, split, policy, trajs, steps
    assert "| travel | train | openai | 1 | 2 |" in card
    assert '| drop_invalid_steps | {"noop": false} | 0 | 1 |' in card  # the oslo step
    assert "Apache-2.0" in card and "| bundled |" in card
    assert "sft: 8" in card
