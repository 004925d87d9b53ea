"""Calibration metrics against hand-computed values."""

from __future__ import annotations

import pytest

from judging.agreement import binary_agreement


def test_hand_computed_confusion_matrix():
    # tp=3, fp=1, fn=2, tn=4  (n=10)
    pred = [True] * 3 + [True] + [False] * 2 + [False] * 4
    ref = [True] * 3 + [False] + [True] * 2 + [False] * 4
    a = binary_agreement(pred, ref)
    assert a.n == 10
    assert a.accuracy == pytest.approx(0.7)
    assert a.precision == pytest.approx(3 / 4)
    assert a.recall == pytest.approx(3 / 5)
    assert a.f1 == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    # kappa: p_o = .7; p_e = .4*.5 + .6*.5 = .5 -> (.7-.5)/.5 = .4
    assert a.kappa == pytest.approx(0.4)
    assert a.judge_success_rate == pytest.approx(0.4)
    assert a.reference_success_rate == pytest.approx(0.5)
    assert a.success_rate_gap == pytest.approx(-0.1)


def test_degenerate_cases():
    all_fail = binary_agreement([False, False], [False, False])
    assert all_fail.accuracy == 1.0 and all_fail.precision is None and all_fail.f1 is None
    assert all_fail.kappa == 1.0
    empty = binary_agreement([], [])
    assert empty.n == 0 and empty.accuracy is None and empty.kappa is None
    # a judge that calls everything a failure (the WebJudge parsing bug) has kappa 0
    bug = binary_agreement([False] * 4, [True, True, False, False])
    assert bug.kappa == pytest.approx(0.0) and bug.recall == 0.0
    with pytest.raises(ValueError, match="3 predictions but 2"):
        binary_agreement([True] * 3, [True] * 2)


def test_agreement_with_human_labels_from_the_warehouse(wh):
    from judging import programmatic
    from judging.agreement import compute_agreements
    from warehouse.records import Agreement, HumanLabel, Task, Trajectory

    wh.write(
        [
            Task(task_id="a", suite="s", site="shop", instruction="i", start_url="u"),
            Task(task_id="b", suite="s", site="wiki", instruction="i", start_url="u"),
        ]
    )
    # (status by the checker, human label): 2 agree on success, 1 agree on failure,
    # 1 judge-success/human-failure, 1 not executable (left out), 1 infra error (no judgment)
    cases = [
        ("t1", "a", "success", "success"),
        ("t2", "a", "success", "success"),
        ("t3", "b", "failure", "failure"),
        ("t4", "b", "success", "failure"),
        ("t5", "b", "failure", "not_executable"),
        ("t6", "a", "infra_error", "success"),
    ]
    wh.write_trajectories(
        [
            Trajectory(
                traj_id=t,
                run_id="r",
                task_id=k,
                policy="p",
                status=st,
                meta={"criteria": [{"name": "c", "passed": st == "success", "detail": ""}]},
            )
            for t, k, st, _ in cases
        ],
        [],
    )
    wh.write(
        [
            HumanLabel(label_id=f"l{t}", traj_id=t, label=lab, reviewer="ann")
            for t, _, _, lab in cases
        ]
    )
    assert programmatic.run(wh) == 5
    assert programmatic.run(wh) == 0  # the backlog is empty now
    rows = {r.site: r for r in compute_agreements(wh, "programmatic", "human")}
    overall = rows[None]
    assert overall.n == 4 and overall.accuracy == pytest.approx(0.75)
    assert overall.precision == pytest.approx(2 / 3) and overall.recall == pytest.approx(1.0)
    assert overall.success_rate_gap == pytest.approx(0.25)
    assert rows["shop"].n == 2 and rows["shop"].accuracy == 1.0
    assert rows["wiki"].n == 2 and rows["wiki"].accuracy == pytest.approx(0.5)
    assert wh.count(Agreement) == 3


def test_calibration_curation_and_judges_read_the_same_judgment_and_task_version(wh):
    """Where the copies disagreed. Calibration took a judge's latest NON-error verdict, curation
    its latest judgment (an error there: not agreeing), so a judge that succeeded with version 1
    and then errored with version 2 was counted right by one and left out by the other. And the
    judge runner judged a trajectory without a recorded task version against the task's latest
    version, the dashboard and calibration against version 1. One rule each now."""
    import datetime as dt

    from curation.filters import Frames, Lake, VerdictParams, verdict
    from curation.recipe import Sources
    from curation.select import scoped_trajectories
    from judging.agreement import compute_agreements, judge_outcomes
    from judging.base import load_views
    from warehouse.records import Judgment, Task, Trajectory
    from warehouse.versions import current_snapshot

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    wh.write(
        [
            Task(task_id="k", suite="s", site="shop", instruction="v1", start_url="u", version=1),
            Task(task_id="k", suite="s", site="wiki", instruction="v2", start_url="u", version=2),
        ]
    )
    wh.write(
        [
            Trajectory(traj_id="a", run_id="r", task_id="k", policy="p", status="finished"),
            Trajectory(traj_id="b", run_id="r", task_id="k", policy="p", status="finished"),
        ]
    )
    wh.write(
        [
            Judgment(judgment_id="a1", traj_id="a", judge="vlm", judge_version="1",
                     verdict="success", created_at=t0),
            Judgment(judgment_id="a2", traj_id="a", judge="vlm", judge_version="2",
                     error="model server down", created_at=t0 + dt.timedelta(minutes=1)),
            Judgment(judgment_id="b1", traj_id="b", judge="vlm", judge_version="2",
                     verdict="success", created_at=t0),
            Judgment(judgment_id="a3", traj_id="a", judge="ref", judge_version="1",
                     verdict="success", created_at=t0),
            Judgment(judgment_id="b3", traj_id="b", judge="ref", judge_version="1",
                     verdict="success", created_at=t0),
        ]
    )  # fmt: skip
    # calibration: a's latest vlm judgment is an error, so a is no pair (it was a success)
    assert judge_outcomes(wh, "vlm") == {"b": True}
    assert judge_outcomes(wh, "vlm", "1") == {"a": True}  # version 1's own latest
    rows = {r.site: r for r in compute_agreements(wh, "vlm", "ref")}
    assert rows[None].n == 1 and set(rows) == {None, "shop"}  # version 1's site, not wiki
    # curation's verdict filter keeps exactly the trajectories calibration counts as success
    lake = Lake(wh, current_snapshot(wh))
    trajs = scoped_trajectories(lake, Sources(splits=()))
    assert trajs["site"].to_list() == ["shop", "shop"]  # it used to read version 2: wiki
    frames = Frames(trajs, trajs.head(0), trajs.head(0)["traj_id"].is_null(), lake)
    kept = verdict(frames, VerdictParams(judges=("vlm",))).trajectories["traj_id"].to_list()
    assert kept == ["b"]
    # the judge runner sees the version the trajectory ran
    assert [v.task.instruction for v in load_views(wh, ["a", "b"])] == ["v1", "v1"]
    assert load_views(wh, ["a"], verdicts=True)[0].verdicts == {"ref": "success"}
