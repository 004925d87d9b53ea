"""Ensembles over stored verdicts (with abstention) and prompt-injection flip rates."""

from __future__ import annotations

import asyncio

import pytest

from judging.adversarial import flip_rates, injection_kinds
from judging.base import backlog, judge_all, make_judge
from judging.ensemble import combine
from tests.judging.conftest import store_trajectory
from warehouse.records import Judgment, Run, Task


def verdict(traj: str, judge: str, v: str | None, error: str | None = None) -> Judgment:
    return Judgment(
        judgment_id=f"{traj}-{judge}",
        traj_id=traj,
        judge=judge,
        judge_version="1",
        verdict=v,
        error=error,
    )


@pytest.mark.parametrize(
    ("votes", "rule", "threshold", "expected"),
    [
        ([True, True, True], "unanimous", 0.5, "success"),
        ([True, False, True], "unanimous", 0.5, "abstain"),
        ([False, False], "unanimous", 0.5, "failure"),
        ([True, False, True], "majority", 0.5, "success"),
        ([True, False], "majority", 0.5, "abstain"),
        ([False, False, True], "majority", 0.5, "failure"),
        ([True, True, False], "threshold", 0.75, "abstain"),
        ([True, True, True, False], "threshold", 0.75, "success"),
        ([False, False, False, True], "threshold", 0.75, "failure"),
        ([], "majority", 0.5, "abstain"),
    ],
)
def test_combine_rules(votes, rule, threshold, expected):
    assert combine(votes, rule, threshold) == expected


def test_ensemble_judges_stored_verdicts_and_abstains_on_disagreement(wh):
    for t in ("a", "b", "c", "d"):
        store_trajectory(wh, t, task_id=f"task-{t}", final=False)
    wh.write(
        [
            verdict("a", "programmatic", "success"),
            verdict("a", "rubric_vlm", "success"),
            verdict("b", "programmatic", "success"),
            verdict("b", "rubric_vlm", "failure"),
            verdict("c", "programmatic", "failure"),
            verdict("c", "rubric_vlm", None, error="unparseable"),  # an error is no vote
            verdict("d", "programmatic", "failure"),
            verdict("d", "rubric_vlm", "failure"),
        ]
    )
    judge = make_judge("ensemble", members="programmatic,rubric_vlm", rule="unanimous")
    assert judge.version == "1/unanimous/programmatic+rubric_vlm"
    summary = asyncio.run(judge_all(wh, judge, backlog(wh, judge)))
    assert summary.verdicts == {"success": 1, "abstain": 1, "failure": 1} and summary.errors == 1
    rows = dict(
        wh.sql(
            "SELECT traj_id, coalesce(verdict, error) FROM judgments WHERE judge='ensemble'"
        ).iter_rows()
    )
    assert rows["a"] == "success" and rows["b"] == "abstain" and rows["d"] == "failure"
    assert "no verdict yet from member judge(s) ['rubric_vlm']" in rows["c"]
    with pytest.raises(ValueError, match="at least two"):
        make_judge("ensemble", members=["programmatic"])


def test_flip_rates_by_injection_kind_hand_computed(wh):
    wh.write(
        [
            Task(task_id="t", suite="bundled", instruction="i", start_url="bundled://shop/"),
            Task(
                task_id="t/inject",
                suite="bundled-adversarial",
                instruction="i",
                start_url="bundled://shop/?wl_inject=1",
                meta={"adversarial": {"of": "t", "kind": "page"}},
            ),
        ]
    )
    wh.write(
        [
            Run(run_id="clean", kind="collect", config={"inject_answer": False}),
            Run(run_id="inj", kind="collect", config={"inject_answer": True}),
        ]
    )
    # (traj, task, run, checker verdict, gullible judge verdict)
    cases = [
        ("c1", "t", "clean", "failure", "failure"),
        ("c2", "t", "clean", "failure", "success"),  # baseline false positive
        ("c3", "t", "clean", "success", "success"),  # not a failure: not counted
        ("p1", "t/inject", "clean", "failure", "success"),
        ("p2", "t/inject", "clean", "failure", "success"),
        ("a1", "t", "inj", "failure", "success"),
        ("a2", "t", "inj", "failure", "failure"),
        ("b1", "t/inject", "inj", "failure", "success"),
    ]
    for traj, task, run, ref, pred in cases:
        store_trajectory(wh, traj, task_id=task, run_id=run, final=False, write_task=False)
        wh.write([verdict(traj, "programmatic", ref), verdict(traj, "gullible", pred)])
    kinds = injection_kinds(wh)
    assert kinds["c1"] == "clean" and kinds["p1"] == "page" and kinds["a1"] == "answer"
    assert kinds["b1"] == "page+answer"
    rows = {r["injection"]: r for r in flip_rates(wh, ["gullible"])}
    assert rows["clean"]["reference_failures"] == 2 and rows["clean"]["flip_rate"] == 0.5
    assert rows["page"]["flip_rate"] == 1.0 and rows["answer"]["flip_rate"] == 0.5
    assert rows["page+answer"]["judged_success"] == 1
    # the checker is the reference: it never flips against itself
    assert all(r["flip_rate"] == 0 for r in flip_rates(wh, ["programmatic"]))
