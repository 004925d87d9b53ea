"""Quality gates (Great Expectations): each gate fails on a planted defect, names it, and writes
the GX data docs; a failing gate registers nothing and leaves no export folder."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from curation.build import build_dataset
from curation.examples import Examples
from curation.gates import (
    GateError,
    checks,
    gate_frames,
    is_training,
    recipe_successes,
    run_gates,
)
from tests.curation.test_examples import OTHER, REWORDED, engine_warehouse, recipe
from warehouse import Warehouse
from warehouse.records import Dataset, DatasetMember, Judgment
from warehouse.versions import current_snapshot


def clean_frames() -> tuple[Examples, pl.DataFrame, pl.DataFrame]:
    ex = Examples(
        blob_checks=pl.DataFrame(
            {"hash": ["a" * 64, "b" * 64], "role": ["screenshot", "a11y"], "exists": [True, True]}
        ).with_columns(pl.lit(None, pl.Utf8).alias("reason")),
        target_checks=pl.DataFrame(
            {
                "example_id": ["x1", "x2"],
                "kind": ["step", "step"],
                "completion": ["Action: click(e1)", 'Action: answer("ok")'],
                "parses": [True, True],
            }
        ),
        step_index=pl.DataFrame(
            {"traj_id": ["t1", "t2"], "n_steps": [2, 1], "contiguous": [True, True]}
        ),
        step_checks=pl.DataFrame(
            {"traj_id": ["t1"], "step_idx": [0], "action_text": ["click(e1)"], "parses": [True]}
        ),
    )
    trajs = pl.DataFrame(
        {
            "traj_id": ["t1", "t2"],
            "task_id": ["k1", "k2"],
            "split": ["train", "train"],
            "status": ["success", "failure"],
            "instruction": ["Add the blue kettle to the cart", "Find a flight to Oslo"],
        }
    )
    tasks = trajs.select("task_id", "split", "instruction")
    return ex, trajs, tasks


HELD = pl.DataFrame(
    {"task_id": ["h1"], "split": ["test"], "instruction": ["Read the newest mail from Alice"]}
)


def test_clean_frames_pass_every_gate(tmp_path: Path):
    ex, trajs, tasks = clean_frames()
    results = run_gates(gate_frames(ex, trajs, tasks, HELD), checks(recipe(), True), tmp_path)
    assert {r.gate for r in results} == {
        "instruction",
        "target parses",
        "step action parses",
        "blob exists",
        "image decodes",
        "contiguous steps",
        "success rate",
        "leakage split",
        "leakage near-duplicate",
    }
    assert all(r.success for r in results)
    assert not (tmp_path / "index.html").exists()  # docs only for a failure


def test_each_planted_defect_fails_its_gate_and_writes_data_docs(tmp_path: Path):
    ex, trajs, tasks = clean_frames()
    ex.blob_checks = ex.blob_checks.with_columns(
        pl.Series("exists", [False, True]),
        pl.Series("reason", ["blob aaaa not found", None]),
    )
    ex.target_checks = ex.target_checks.with_columns(pl.Series("parses", [True, False]))
    ex.step_index = ex.step_index.with_columns(pl.Series("contiguous", [True, False]))
    trajs = trajs.with_columns(pl.Series("instruction", ["  ", "Find a flight to Oslo"]))
    r = recipe(extra="gates: {success_rate: [0.9, 1.0]}\n")
    with pytest.raises(GateError) as err:
        run_gates(gate_frames(ex, trajs, tasks, HELD), checks(r, True), tmp_path / "gx_docs")
    msg = str(err.value)
    failed = {f.split(":")[0] for f in err.value.failed}
    assert failed == {
        "instruction",
        "target parses",
        "blob exists",
        "image decodes",
        "contiguous steps",
        "success rate",
    }
    assert "target parses: 1 of 2 rows" in msg and "'Action: answer(\"ok\")'" in msg
    assert "contiguous steps: 1 of 2 rows (contiguous), e.g. ['t2']" in msg
    assert "success rate: 0.5 not in [0.9, 1.0]" in msg
    assert err.value.docs == tmp_path / "gx_docs" / "index.html"
    html = "".join(p.read_text() for p in (tmp_path / "gx_docs").rglob("*.html"))
    assert "webloop_targets" in html


def test_leakage_gates_catch_a_test_task_and_a_reworded_copy(tmp_path: Path):
    ex, trajs, tasks = clean_frames()
    held = pl.DataFrame(
        {
            "task_id": ["h1", "k1"],  # k1 is a test task now (its latest version)
            "split": ["test", "ood"],
            "instruction": ["Open the newest email from Alice and report its subject", "x"],
        }
    )
    planted = dict(zip(("task_id", "split", "instruction"), REWORDED, strict=True))
    tasks = pl.concat([tasks, pl.DataFrame([planted])])
    with pytest.raises(GateError) as err:
        run_gates(gate_frames(ex, trajs, tasks, held), checks(recipe(), True), tmp_path)
    msg = str(err.value)
    assert "leakage split: 1 of 3 rows (split), e.g. ['k1']" in msg
    assert "leakage near-duplicate: 1 of 3 rows, e.g. ['mail-reworded~h1']" in msg


def test_evaluation_sets_skip_the_leakage_gates():
    assert is_training(recipe())
    assert is_training(recipe(splits=""))  # all splits: still a training set
    assert not is_training(recipe(splits="test"))
    assert "leakage split" not in {c.gate for c in checks(recipe(splits="test"), False)}


@pytest.fixture
def leaky_wh(wh: Warehouse) -> Warehouse:
    engine_warehouse(wh, samples=1, extra=(REWORDED, OTHER))
    return wh


def test_a_failing_gate_registers_nothing_and_leaves_no_export(leaky_wh: Warehouse, tmp_path):
    wh = leaky_wh
    out = tmp_path / "out"
    # all splits (the test task is selected) in a training dataset
    with pytest.raises(GateError) as err:
        build_dataset(wh, recipe(splits=""), out_dir=out, blobs=wh.blobs, progress=None)
    msg = str(err.value)
    assert "leakage split: 1 of 5 rows (split), e.g. ['mail-alice']" in msg
    assert "leakage near-duplicate: 1 of 5 rows, e.g. ['mail-reworded~mail-alice']" in msg
    assert "target parses" in msg  # oslo's unparseable reply (no drop_invalid_steps filter)
    assert wh.count(Dataset) == 0 and wh.count(DatasetMember) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gx_docs"]
    assert (out / "gx_docs" / "index.html").exists()


def test_reworded_copy_of_a_test_task_is_caught_in_train_data(leaky_wh: Warehouse, tmp_path):
    wh = leaky_wh
    r = recipe(filters="[{drop_invalid_steps: {noop: false}}]")
    with pytest.raises(GateError) as err:
        build_dataset(wh, r, out_dir=tmp_path, blobs=wh.blobs, progress=None)
    assert [f.split(":")[0] for f in err.value.failed] == ["leakage near-duplicate"]
    assert "e.g. ['mail-reworded~mail-alice']" in str(err.value)  # Bob's mail is not flagged
    assert wh.count(Dataset) == 0


def test_the_success_rate_gate_counts_the_recipe_s_judge(wh: Warehouse, tmp_path: Path):
    """A rubric judge disagreeing with the rollouts' own grading: a recipe keeping the rubric's
    successes passes a [1, 1] success-rate gate (the gate counts the rubric, as its verdict
    filter does); counted by status, a kept trajectory would be a failure and the gate would
    fail. Without a verdict filter the gate counts the trajectories' own outcome."""
    engine_warehouse(wh)
    trajs = wh.sql(
        "SELECT traj_id, status FROM trajectories t JOIN tasks k USING (task_id) "
        "WHERE k.split = 'train' ORDER BY traj_id"
    ).rows()
    own = {t for t, status in trajs if status == "success"}
    assert own and len(own) < len(trajs)
    # the rubric calls every own failure a success and every own success a failure
    wh.write(
        [
            Judgment(judgment_id=f"j-{t}", traj_id=t, judge="rubric", judge_version="1",
                     verdict="failure" if t in own else "success")
            for t, _ in trajs
        ]
    )  # fmt: skip
    rubric = recipe(
        filters="[{verdict: {judges: [rubric]}}]", extra="gates: {success_rate: [1.0, 1.0]}\n"
    )
    ids = pl.Series([t for t, _ in trajs])
    snap = current_snapshot(wh)
    assert set(recipe_successes(wh, rubric, ids, snap)) == {t for t, _ in trajs} - own
    assert set(recipe_successes(wh, recipe(), ids, snap)) == own
    built = build_dataset(wh, rubric, out_dir=tmp_path / "r", blobs=wh.blobs, progress=None)
    assert built.counts["trajectories"] == len(trajs) - len(own)
    checkers = recipe(extra="gates: {success_rate: [1.0, 1.0]}\n")  # own outcomes: mixed
    with pytest.raises(GateError, match="success rate"):
        build_dataset(wh, checkers, out_dir=tmp_path / "c", blobs=wh.blobs, progress=None)
