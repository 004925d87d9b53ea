"""The shared relations (warehouse/relations.py) and the one query-file runner, against
hand-built rows: which task version a trajectory ran, which judgment of a judge is the latest."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from warehouse import Warehouse, WarehouseError
from warehouse.datasets import COMPOSITION_COLUMNS, dataset_composition
from warehouse.records import DatasetMember, HumanLabel, Judgment, StepScore, Task, Trajectory
from warehouse.relations import with_relations
from warehouse.store import run_sql_file
from warehouse.versions import current_snapshot

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def task(version: int, split: str, site: str = "shop") -> Task:
    return Task(
        task_id="k",
        suite="s",
        site=site,
        split=split,
        instruction=f"v{version}",
        start_url="u",
        version=version,
    )


def judgment(jid: str, traj: str, version: str, minutes: int, **kw) -> Judgment:
    return Judgment(
        judgment_id=jid,
        traj_id=traj,
        judge="rubric",
        judge_version=version,
        created_at=T0 + dt.timedelta(minutes=minutes),
        **kw,
    )


@pytest.fixture
def versions(wh: Warehouse) -> Warehouse:
    """Task k in three versions; trajectories that recorded 2, recorded none, recorded 5."""
    wh.write([task(1, "train"), task(2, "test", site="wiki"), task(3, "ood")])
    wh.write(
        [
            Trajectory(traj_id="ran2", run_id="r", task_id="k", policy="p", status="success",
                       task_version=2),
            Trajectory(traj_id="legacy", run_id="r", task_id="k", policy="p", status="success"),
            Trajectory(traj_id="lost", run_id="r", task_id="k", policy="p", status="success",
                       task_version=5),
        ]
    )  # fmt: skip
    return wh


def test_a_trajectory_ran_the_version_it_recorded_and_a_legacy_row_version_1(versions):
    rows = versions.sql(
        with_relations("SELECT traj_id, version, split FROM trajectory_tasks ORDER BY traj_id")
    ).rows()
    # never the latest version (3): the legacy row ran version 1; a version that is not stored
    # (5) gives no row at all, rather than another version's task
    assert rows == [("legacy", 1, "train"), ("ran2", 2, "test")]


def test_latest_judgment_an_error_after_a_verdict_is_the_latest(wh: Warehouse):
    wh.write(
        [
            judgment("a1", "a", "1", 0, verdict="success"),
            judgment("a2", "a", "2", 5, error="model server down"),  # newer: the latest
            judgment("b1", "b", "1", 0, verdict="failure"),
            judgment("b2", "b", "2", 0, verdict="success"),  # same time: higher version wins
            judgment("c1", "c", "1", 0, verdict="abstain"),
        ]
    )
    latest = wh.sql(
        with_relations(
            "SELECT traj_id, judgment_id FROM latest_judgments WHERE judge = 'rubric' "
            "ORDER BY traj_id"
        )
    ).rows()
    assert latest == [("a", "a2"), ("b", "b2"), ("c", "c1")]
    per_version = wh.sql(
        with_relations(
            "SELECT judgment_id FROM latest_judgments_per_version WHERE judge_version = '1' "
            "ORDER BY 1"
        )
    ).rows()
    assert per_version == [("a1",), ("b1",), ("c1",)]
    # any judge's decided latest judgment: a has none now (its judge errored), c abstained
    verdicts = wh.sql(
        with_relations("SELECT traj_id, verdict FROM trajectory_verdicts ORDER BY 1")
    ).rows()
    assert verdicts == [("b", "success")]


def score(traj: str, version: str, minutes: int, **kw) -> StepScore:
    return StepScore(
        traj_id=traj, step_idx=0, cand_idx=0, scorer="exact", scorer_version=version,
        created_at=T0 + dt.timedelta(minutes=minutes), **kw,
    )  # fmt: skip


def label(lid: str, traj: str, value: str, minutes: int, step: int | None = None) -> HumanLabel:
    return HumanLabel(
        label_id=lid, traj_id=traj, label=value, reviewer="r", step_idx=step,
        created_at=T0 + dt.timedelta(minutes=minutes),
    )  # fmt: skip


def test_latest_step_score_an_error_after_a_score_is_the_latest(wh: Warehouse):
    wh.write(
        [
            score("a", "1", 0, score=0.5),
            score("a", "2", 5, error="replay crashed"),  # newer: the latest, no score now
            score("b", "1", 0, score=0.0),
            score("b", "2", 0, score=1.0),  # same time: the higher version wins
        ]
    )
    q = "SELECT traj_id, scorer_version, score, error FROM {} ORDER BY 1, 2"
    latest = wh.sql(with_relations(q.format("latest_step_scores"))).rows()
    assert latest == [("a", "2", None, "replay crashed"), ("b", "2", 1.0, None)]
    per_version = wh.sql(with_relations(q.format("latest_step_scores_per_version"))).rows()
    assert [r[:3] for r in per_version] == [
        ("a", "1", 0.5), ("a", "2", None), ("b", "1", 0.0), ("b", "2", 1.0)
    ]  # fmt: skip


def test_latest_human_label_is_trajectory_level_and_ties_break_by_id(wh: Warehouse):
    wh.write(
        [
            label("x1", "x", "success", 0),
            label("x2", "x", "failure", 5),  # newer: the latest
            label("x3", "x", "success", 9, step=2),  # a step's label: not the trajectory's
            label("y1", "y", "failure", 0),
            label("y2", "y", "not_executable", 0),  # same time: the higher id wins
        ]
    )
    rows = wh.sql(
        with_relations("SELECT traj_id, label_id, label FROM latest_human_labels ORDER BY 1")
    ).rows()
    assert rows == [("x", "x2", "failure"), ("y", "y2", "not_executable")]


def test_latest_task_is_the_highest_version(versions):
    rows = versions.sql(with_relations("SELECT task_id, version, split FROM latest_tasks")).rows()
    assert rows == [("k", 3, "ood")]


def test_the_latest_rules_are_written_once():
    """Queries name the relations; no module writes a "latest" rule of these tables inline (the
    bench's independent count excepted: it re-derives curation's result on purpose)."""
    root = Path(__file__).parents[2]
    inline = re.compile(
        r"FROM\s+(?:\{LAKE\}\.|lake\.)?(human_labels|step_scores|tasks|judgments)\b[^;]*?QUALIFY",
        re.S | re.I,
    )
    allowed = {
        "warehouse/relations.py",
        "bench/curation.py",
        # not "latest": the newest of a task's held-out versions (any version of a task that
        # was ever test / ood is held out for the leakage gates)
        "curation/gates.py",
    }
    found = []
    for path in [*root.glob("*/**/*.py"), *root.glob("*/**/*.sql")]:
        rel = path.relative_to(root).as_posix()
        if rel.startswith((".", "tests/")) or "/." in rel or rel in allowed:
            continue
        text = path.read_text(errors="replace")
        found += [f"{rel}: {m.group(1)}" for m in inline.finditer(text)]
    assert found == []


def test_relations_read_at_a_pinned_snapshot(versions):
    snap = current_snapshot(versions)
    versions.write(
        [Trajectory(traj_id="later", run_id="r", task_id="k", policy="p", status="failure")]
    )
    query = with_relations("SELECT count(*) FROM trajectory_tasks", at="$snap")
    assert "AT (VERSION => $snap)" in query
    assert versions.sql(query, {"snap": snap}).item() == 2
    assert versions.sql(with_relations("SELECT count(*) FROM trajectory_tasks")).item() == 3


def test_with_relations_joins_a_query_s_own_ctes_after_its_comments():
    q = "-- a comment naming nothing\nWITH mine AS (SELECT 1)\nSELECT * FROM latest_judgments"
    out = with_relations(q)
    assert out.startswith("-- a comment naming nothing\nWITH latest_judgments AS (")
    assert "),\nmine AS (SELECT 1)\nSELECT * FROM latest_judgments" in out
    assert with_relations("SELECT 1") == "SELECT 1"
    # a relation built on another brings it along, first
    both = with_relations("SELECT * FROM trajectory_verdicts")
    assert both.index("latest_judgments AS") < both.index("trajectory_verdicts AS")


def test_the_one_query_file_runner_is_generic_over_the_folder(versions, tmp_path: Path):
    (tmp_path / "by_split.sql").write_text(
        "-- trajectories per split of the version they ran\n"
        "SELECT k.split, count(*) AS n FROM trajectory_tasks AS k "
        "WHERE $split IS NULL OR k.split = $split GROUP BY ALL ORDER BY ALL\n"
    )
    assert run_sql_file(versions, tmp_path, "by_split").rows() == [("test", 1), ("train", 1)]
    assert run_sql_file(versions, tmp_path, "by_split", split="test").rows() == [("test", 1)]
    with pytest.raises(WarehouseError, match=r"no query named 'nope' in .* \(known: by_split\)"):
        run_sql_file(versions, tmp_path, "nope")
    with pytest.raises(WarehouseError, match="takes no parameter"):
        run_sql_file(versions, tmp_path, "by_split", site="x")


def test_dataset_composition_rows(versions):
    versions.write(
        [
            DatasetMember(dataset_id="d", traj_id="ran2", split="test"),
            DatasetMember(dataset_id="d", traj_id="ran2", step_idx=0, split="test"),
            DatasetMember(dataset_id="d", traj_id="ran2", step_idx=1, split="test"),
            DatasetMember(dataset_id="d", traj_id="legacy", split="train"),
            DatasetMember(dataset_id="d", traj_id="lost", step_idx=3, split="intervention"),
            DatasetMember(dataset_id="other", traj_id="legacy", split="train"),
        ]
    )
    rows = dataset_composition(versions, "d")
    assert all(tuple(r) == COMPOSITION_COLUMNS for r in rows)
    assert [tuple(r.values()) for r in rows] == [
        ("?", "intervention", "p", 1, 1),  # its task version is not stored: site unknown
        ("shop", "train", "p", 1, 0),  # legacy: version 1's site, not the latest's
        ("wiki", "test", "p", 1, 2),
    ]
    assert dataset_composition(versions, "nope") == []
