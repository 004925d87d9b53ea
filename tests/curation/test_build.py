"""build_dataset: registration (Dataset + members in one transaction), progress lines, empty
results and unknown snapshots as clear errors."""

from __future__ import annotations

import pytest

from curation.build import CurationError, build_dataset, dataset_id_for
from curation.recipe import RecipeError, recipe_hash
from tests.curation.test_examples import engine_warehouse, recipe
from warehouse import Warehouse
from warehouse.records import Dataset, DatasetMember, Pin

FILTERS = "[{drop_invalid_steps: {noop: false}}]"


@pytest.fixture
def engine_wh(wh: Warehouse) -> Warehouse:
    engine_warehouse(wh)
    return wh


def test_build_registers_the_dataset_and_its_members(engine_wh: Warehouse, tmp_path):
    wh = engine_wh
    lines: list[str] = []
    r = recipe(filters=FILTERS)
    ds = build_dataset(wh, r, out_dir=tmp_path / "out", blobs=wh.blobs, progress=lines.append)
    assert ds.dataset_id == dataset_id_for(r, ds.snapshot_id)
    assert ds.recipe_hash == recipe_hash(r)
    stored = wh.records(Dataset)
    assert [d.dataset_id for d in stored] == [ds.dataset_id]
    assert stored[0].counts == {"sft": 8, "rl": 3, "preferences": 1, "trajectories": 3, "steps": 8}
    members = wh.sql(
        "SELECT count(*) FILTER (WHERE step_idx IS NULL) AS t, count(step_idx) AS s "
        "FROM dataset_members WHERE dataset_id = ?",
        [ds.dataset_id],
    ).row(0)
    assert members == (3, 8)
    assert [p.snapshot_id for p in wh.records(Pin)] == [ds.snapshot_id]
    stages = [line.split(":")[0] for line in lines if line.startswith("curate ")]
    assert stages == [
        "curate validate",
        "curate pin",
        "curate select",
        "curate examples",
        "curate gates",
        "curate export",
        "curate register",
    ]
    assert all(line.endswith(" s)") for line in lines if line.startswith("curate "))
    # rebuilding the same recipe at the same snapshot leaves one dataset, same members
    build_dataset(
        wh, r, out_dir=tmp_path / "out", snapshot_id=ds.snapshot_id, blobs=wh.blobs, progress=None
    )
    assert wh.count(Dataset) == 1 and wh.count(DatasetMember) == 11
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"demo-set-{ds.dataset_id}"]


def test_empty_selection_names_the_filter_that_removed_the_last_rows(engine_wh, tmp_path):
    wh = engine_wh
    r = recipe(filters="[{length: {min_steps: 10, max_steps: 30}}]")
    with pytest.raises(CurationError, match=r"selected nothing: filter 'length' removed the last"):
        build_dataset(wh, r, out_dir=tmp_path / "out", blobs=wh.blobs, progress=None)
    assert wh.count(Dataset) == 0 and not (tmp_path / "out").exists()


def test_sources_that_match_nothing_say_so(engine_wh, tmp_path):
    wh = engine_wh
    r = recipe(splits="valid")
    with pytest.raises(CurationError, match=r"sources .* match no trajectories"):
        build_dataset(wh, r, out_dir=tmp_path / "out", blobs=wh.blobs, progress=None)


def test_unknown_snapshot_and_unknown_names_fail_before_work(engine_wh, tmp_path):
    wh = engine_wh
    with pytest.raises(CurationError, match="--snapshot 999: no such warehouse snapshot"):
        build_dataset(wh, recipe(), out_dir=tmp_path / "out", snapshot_id=999, blobs=wh.blobs)
    bad = recipe(extra="include: {rationales: nobody}\n")
    with pytest.raises(RecipeError, match=r"include\.rationales"):
        build_dataset(wh, bad, out_dir=tmp_path / "out", blobs=wh.blobs, progress=None)
    assert wh.count(Pin) == 0 and wh.count(Dataset) == 0
