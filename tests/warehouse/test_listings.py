"""The CLI's listings (``warehouse.listings``) over a small warehouse: the sample's tasks and run,
plus hand-written judgments, datasets, members and evaluations with known answers."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseConfig, listings, sample
from warehouse.records import Dataset, DatasetMember, Evaluation, Judgment
from warehouse.tasks import put_tasks

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def data() -> sample.Sample:
    return sample.generate(seed=1, n_tasks=8, samples=1)


@pytest.fixture(scope="module")
def wh(tmp_path_factory, data: sample.Sample):
    home: Path = tmp_path_factory.mktemp("listings") / "home"
    with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as w:
        sample.load(w, data)
        # wiki-0003 gets a second version: listings show only the latest
        first = next(t for t in data.tasks if t.task_id.endswith("wiki-0003"))
        put_tasks(w, [dataclasses.replace(first, instruction="changed", difficulty=99)])
        trajs = [t.traj_id for t in data.trajectories]
        w.write(
            [
                Judgment(judgment_id=f"j{i}", traj_id=trajs[i], judge="vlm", judge_version=v)
                for i, v in enumerate(["2", "1", "1", "10"])
            ]
            + [Judgment(judgment_id="e", traj_id=trajs[0], judge="other", judge_version="x")]
        )
        w.write(
            [
                Dataset(dataset_id="ds-1", name="mix", snapshot_id=1, created_at=T0),
                Dataset(
                    dataset_id="ds-2", name="mix", snapshot_id=2, created_at=T0 + dt.timedelta(1)
                ),
                # named like another dataset's id: the id wins
                Dataset(dataset_id="ds-3", name="ds-1", snapshot_id=2, created_at=T0),
                Dataset(dataset_id="ds-0", name="alpha", snapshot_id=1, created_at=T0),
            ]
        )
        a, b, c = trajs[:3]
        w.write(
            [
                DatasetMember(dataset_id="ds-1", traj_id=a),
                DatasetMember(dataset_id="ds-1", traj_id=a, step_idx=0),
                DatasetMember(dataset_id="ds-1", traj_id=b, step_idx=1),
                DatasetMember(dataset_id="ds-2", traj_id=a),
                DatasetMember(dataset_id="ds-2", traj_id=c),
                DatasetMember(dataset_id="ds-2", traj_id=c, step_idx=2),
                DatasetMember(dataset_id="ds-2", traj_id=c, step_idx=0),
            ]
        )
        w.write(
            [
                Evaluation(
                    evaluation_id=f"ev{i}",
                    suite="bundled",
                    split=split,
                    n=10,
                    n_success=i,
                    success_rate=i / 10,
                    checkpoint_id="ck",
                    ci_low=0.0,
                    ci_high=0.5,
                    created_at=T0 + dt.timedelta(hours=hours),
                )
                for i, (split, hours) in enumerate([("test", 2), ("ood", 1), ("train", 3)])
            ]
            + [
                Evaluation(
                    evaluation_id="other",
                    suite="bundled",
                    split="test",
                    n=1,
                    n_success=1,
                    success_rate=1.0,
                    checkpoint_id="ck-other",
                )
            ]
        )
        yield w


def _ids(df) -> list[str]:
    return df["task_id"].to_list()


def test_matching_tasks_filters_the_latest_versions(wh: Warehouse, data: sample.Sample):
    tasks = {t.task_id: t for t in data.tasks}
    every = listings.matching_tasks(wh)
    assert tuple(every.columns) == listings.TASK_COLUMNS
    assert _ids(every) == sorted(tasks)
    changed = every.filter(every["task_id"].str.ends_with("wiki-0003")).row(0, named=True)
    assert (changed["version"], changed["instruction"], changed["difficulty"]) == (2, "changed", 99)

    def expect(keep) -> list[str]:
        return sorted(i for i, t in tasks.items() if not i.endswith("wiki-0003") and keep(t))

    assert _ids(listings.matching_tasks(wh, site="shop")) == sorted(
        i for i, t in tasks.items() if t.site == "shop"
    )
    assert _ids(listings.matching_tasks(wh, split="test", suite=sample.SUITE)) == sorted(
        i for i, t in tasks.items() if t.split == "test"
    )
    assert _ids(listings.matching_tasks(wh, min_difficulty=4, max_difficulty=6)) == expect(
        lambda t: 4 <= t.difficulty <= 6
    )
    assert _ids(listings.matching_tasks(wh, difficulty=99)) == [changed["task_id"]]
    assert listings.matching_tasks(wh, suite="nope").is_empty()


def test_run_exists(wh: Warehouse, data: sample.Sample):
    assert listings.run_exists(wh, data.run.run_id)
    assert not listings.run_exists(wh, "no-such-run")


def test_judge_versions(wh: Warehouse):
    assert listings.judge_versions(wh, "vlm") == ["1", "10", "2"]  # text order, distinct
    assert listings.judge_versions(wh, "other") == ["x"]
    assert listings.judge_versions(wh, "nope") == []


def test_datasets_listed_newest_first_and_found_by_id_or_name(wh: Warehouse):
    df = listings.registered_datasets(wh)
    assert df.columns == [
        "dataset_id",
        "name",
        "snapshot_id",
        "counts",
        "export_path",
        "code_version",
        "created_at",
    ]
    assert df["dataset_id"].to_list() == ["ds-2", "ds-0", "ds-1", "ds-3"]
    assert listings.find_dataset(wh, "mix")["dataset_id"] == "ds-2"  # the newest of the name
    assert listings.find_dataset(wh, "ds-1")["name"] == "mix"  # an id beats a name
    assert listings.find_dataset(wh, "alpha")["snapshot_id"] == 1
    assert listings.find_dataset(wh, "nope") is None
    assert listings.dataset_names(wh) == ["alpha", "ds-1", "mix"]


def test_dataset_members_counted_and_diffed(wh: Warehouse, data: sample.Sample):
    a, b, c = (t.traj_id for t in data.trajectories[:3])
    assert listings.dataset_member_counts(wh, "ds-1") == {"trajectories": 1, "steps": 2}
    assert listings.dataset_member_counts(wh, "ds-2") == {"trajectories": 2, "steps": 2}
    assert listings.dataset_member_counts(wh, "nope") == {"trajectories": 0, "steps": 0}
    diff = listings.dataset_member_diff(wh, "ds-1", "ds-2")
    assert diff.columns == ["change", "traj_id", "step_idx"]
    added = sorted([(c, None), (c, 0), (c, 2)], key=lambda r: (r[0], r[1] is not None, r[1]))
    removed = sorted([(a, 0), (b, 1)])
    assert diff.rows() == [("added", *r) for r in added] + [("removed", *r) for r in removed]
    back = listings.dataset_member_diff(wh, "ds-2", "ds-1")
    assert {r[0] for r in back.rows()} == {"added", "removed"} and len(back) == len(diff)
    assert listings.dataset_member_diff(wh, "ds-1", "ds-1").is_empty()


def test_checkpoint_evaluations_oldest_first(wh: Warehouse):
    df = listings.checkpoint_evaluations(wh, "ck")
    assert df.columns == [
        "evaluation_id",
        "suite",
        "split",
        "n",
        "success_rate",
        "ci_low",
        "ci_high",
    ]
    assert df.select("evaluation_id", "split", "success_rate").rows() == [
        ("ev1", "ood", 0.1),
        ("ev0", "test", 0.0),
        ("ev2", "train", 0.2),
    ]
    assert listings.checkpoint_evaluations(wh, "nope").is_empty()
