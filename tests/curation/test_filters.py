"""Each registered filter on the hand-countable fixture (tests/curation/fixture.py).

Scope of every test (default sources, split train) after ``exclude_infra``: 9 trajectories,
38 steps — t01 3, t02 3, t03 4, t04 2, t05 4, t06 6, t07 2, t12 12, t13 2.
"""

from __future__ import annotations

import pytest

from curation.filters import FILTERS, params_model
from tests.curation.fixture import kept_steps, report_of, run

ALL = {"t01", "t02", "t03", "t04", "t05", "t06", "t07", "t12", "t13"}
STEPS = {"t01": 3, "t02": 3, "t03": 4, "t04": 2, "t05": 4, "t06": 6, "t07": 2, "t12": 12, "t13": 2}


def ids(sel) -> set[str]:
    return set(sel.trajectories.get_column("traj_id").to_list())


def test_registry_lists_every_filter() -> None:
    assert FILTERS.names() == [
        "before_first_error",
        "dedup_tasks",
        "dedup_trajectories",
        "drop_invalid_steps",
        "drop_loops",
        "length",
        "prm_threshold",
        "verdict",
    ]
    assert params_model("length")(min_steps=2).min_steps == 2
    with pytest.raises(ValueError, match="unknown filter 'nope'"):
        params_model("nope")


def test_exclude_infra_always_first(shared_wh) -> None:
    sel = run(shared_wh, "filters: []\n")
    # 12 train trajectories, 40 stored steps; t08 (infra_error, 1 step), t09 (timeout, 0),
    # t10 (running, 1) go: 3 trajectories, 2 steps.
    assert report_of(sel) == [("exclude_infra", 3, 2)]
    assert ids(sel) == ALL
    assert sel.steps.height == 38
    assert kept_steps(sel) == {t: list(range(n)) for t, n in STEPS.items()}


def test_verdict_single_judge_latest_judgment_counts(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{verdict: {judges: [programmatic]}}]\n")
    # programmatic success: t01 t02 t03 t04 t06 t07. t05's older success is overridden by a
    # newer failure; t12 t13 failure → removed t05 (4) t12 (12) t13 (2) = 3 trajs, 18 steps.
    assert report_of(sel)[1] == ("verdict", 3, 18)
    assert ids(sel) == {"t01", "t02", "t03", "t04", "t06", "t07"}


def test_verdict_two_judges_full_agreement(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{verdict: {judges: [programmatic, vlm]}}]\n")
    # Both say success only on t01 and t03 (vlm: failure on t04, ERROR on t06, nothing on
    # t02 t07 t12 t13; t05 programmatic latest failure). Removed 7 trajs: 3+2+4+6+2+12+2 = 31.
    assert report_of(sel)[1] == ("verdict", 7, 31)
    assert ids(sel) == {"t01", "t03"}


def test_verdict_min_agreement_half(shared_wh) -> None:
    sel = run(
        shared_wh, "filters: [{verdict: {judges: [programmatic, vlm], min_agreement: 0.5}}]\n"
    )
    # ≥ 1 of 2: programmatic success (t01 t02 t03 t04 t06 t07) or vlm success (t05).
    # Removed t12 (12) and t13 (2). t06 passes on programmatic alone though vlm errored.
    assert report_of(sel)[1] == ("verdict", 2, 14)
    assert ids(sel) == ALL - {"t12", "t13"}


def test_verdict_failure(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{verdict: {judges: [programmatic], verdict: failure}}]\n")
    # latest programmatic failure: t05 t12 t13 → 6 trajectories removed: 3+3+4+2+6+2 = 20.
    assert report_of(sel)[1] == ("verdict", 6, 20)
    assert ids(sel) == {"t05", "t12", "t13"}


def test_prm_threshold_drops_unscored_by_default(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{prm_threshold: {scorer: exact, min_score: 0.5}}]\n")
    # Only t03 has scores. Its executed actions: step 0 → 1.0 keep; step 1 → 0.2 drop; step 2:
    # no candidate with the taken action → unscored → drop; step 3 → latest of cand 0 is 0.8
    # (v1 0.1 is older; cand 1's error row is no score) → keep. Every other trajectory has no
    # score on any step → all its steps go and it goes: 8 trajs, 38 - 2 = 36 steps.
    assert report_of(sel)[1] == ("prm_threshold", 8, 36)
    assert kept_steps(sel) == {"t03": [0, 3]}


def test_prm_threshold_keep_unscored(shared_wh) -> None:
    sel = run(
        shared_wh,
        "filters: [{prm_threshold: {scorer: exact, min_score: 0.5, unscored: keep}}]\n",
    )
    # Only t03 step 1 (0.2) is scored below 0.5.
    assert report_of(sel)[1] == ("prm_threshold", 0, 1)
    assert kept_steps(sel)["t03"] == [0, 2, 3]
    assert sel.steps.height == 37


def test_prm_threshold_pinned_scorer_version(shared_wh) -> None:
    sel = run(
        shared_wh,
        "filters: [{prm_threshold: {scorer: exact, min_score: 0.5, version: '1', "
        "unscored: keep}}]\n",
    )
    # Version 1 scored only t03 step 3 (0.1) → that step goes; nothing else is scored by v1.
    assert report_of(sel)[1] == ("prm_threshold", 0, 1)
    assert kept_steps(sel)["t03"] == [0, 1, 2]


def test_before_first_error_keeps_the_failed_prefixes(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{before_first_error: {}}]\n")
    # Failures: t05 (first error at step 3: steps 0-2 stay), t12 and t13 (first error at step
    # 0: nothing stays, so they go). 2 trajectories, 1 + 12 + 2 = 15 steps; successes untouched.
    assert report_of(sel)[1] == ("before_first_error", 2, 15)
    assert ids(sel) == ALL - {"t12", "t13"}
    assert kept_steps(sel)["t05"] == [0, 1, 2] and kept_steps(sel)["t06"] == list(range(6))


def test_before_first_error_of_another_proposer_or_unlocated(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{before_first_error: {proposer: teacher-b}}]\n")
    # teacher-b located no error: every failed trajectory goes whole (4 + 12 + 2 steps)
    assert report_of(sel)[1] == ("before_first_error", 3, 18)
    sel = run(
        shared_wh, "filters: [{before_first_error: {proposer: teacher-b, unlocated: keep}}]\n"
    )
    assert report_of(sel)[1] == ("before_first_error", 0, 0) and ids(sel) == ALL


def test_drop_invalid_steps_with_and_without_noop(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{drop_invalid_steps: {}}]\n")
    # t05 (all on screen s1, same url): step 0 action error, step 1 no action, step 2 a scroll
    # after which the screen is unchanged (no-op); step 3 is the last step (never a no-op).
    assert report_of(sel)[1] == ("drop_invalid_steps", 0, 3)
    assert kept_steps(sel)["t05"] == [3]
    sel = run(shared_wh, "filters: [{drop_invalid_steps: {noop: false}}]\n")
    assert report_of(sel)[1] == ("drop_invalid_steps", 0, 2)
    assert kept_steps(sel)["t05"] == [2, 3]


def test_drop_loops(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{drop_loops: {max_repeats: 2}}]\n")
    # t06: (s4, click(e3)) at steps 0, 2, 4 → the third (step 4) goes; (s5, back()) twice → kept.
    assert report_of(sel)[1] == ("drop_loops", 0, 1)
    assert kept_steps(sel)["t06"] == [0, 1, 2, 3, 5]
    sel = run(shared_wh, "filters: [{drop_loops: {max_repeats: 1}}]\n")
    # steps 2 and 4 (click again) and 3 (back again) go.
    assert report_of(sel)[1] == ("drop_loops", 0, 3)
    assert kept_steps(sel)["t06"] == [0, 1, 5]


def test_length(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{length: {min_steps: 3, max_steps: 10}}]\n")
    # too short: t04 (2) t07 (2) t13 (2); too long: t12 (12) → 4 trajs, 18 steps.
    assert report_of(sel)[1] == ("length", 4, 18)
    assert ids(sel) == {"t01", "t02", "t03", "t05", "t06"}


def test_dedup_trajectories(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{dedup_trajectories: {}}]\n")
    # t02 repeats t01's task, screens and actions: the later id (t02) goes, 3 steps.
    assert report_of(sel)[1] == ("dedup_trajectories", 1, 3)
    assert ids(sel) == ALL - {"t02"}


def test_dedup_trajectories_looks_at_all_stored_steps(shared_wh) -> None:
    # After a step filter t01/t02 still have the same full sequences: still deduplicated;
    # t05's kept steps alone would not make it equal to anything.
    sel = run(shared_wh, "filters: [{drop_invalid_steps: {}}, {dedup_trajectories: {}}]\n")
    assert report_of(sel)[2] == ("dedup_trajectories", 1, 3)


def test_dedup_tasks(shared_wh) -> None:
    sel = run(shared_wh, "filters: [{dedup_tasks: {threshold: 0.92}}]\n")
    # task-2 "Put the blue kettle into your cart" rewords task-1 (cosine 0.936): task-2's
    # trajectory t07 goes (2 steps); the first task id (task-1) stays.
    assert report_of(sel)[1] == ("dedup_tasks", 1, 2)
    assert ids(sel) == ALL - {"t07"}
    sel = run(shared_wh, "filters: [{dedup_tasks: {threshold: 0.99}}]\n")
    assert report_of(sel)[1] == ("dedup_tasks", 0, 0)


def test_filters_compose_in_order(shared_wh) -> None:
    sel = run(
        shared_wh,
        "filters:\n"
        "  - verdict: {judges: [programmatic]}\n"  # -t05 t12 t13: 3 trajs, 18 steps
        "  - drop_loops: {max_repeats: 2}\n"  # t06 step 4: 1 step
        "  - dedup_trajectories: {}\n"  # t02: 1 traj, 3 steps
        "  - length: {min_steps: 3}\n",  # t04 t07 (2 each): 2 trajs, 4 steps
    )
    assert report_of(sel) == [
        ("exclude_infra", 3, 2),
        ("verdict", 3, 18),
        ("drop_loops", 0, 1),
        ("dedup_trajectories", 1, 3),
        ("length", 2, 4),
    ]
    assert kept_steps(sel) == {"t01": [0, 1, 2], "t03": [0, 1, 2, 3], "t06": [0, 1, 2, 3, 5]}


def test_accessibility_only_steps_are_observed_by_their_tree(fixture_wh) -> None:
    """Steps without a screenshot (accessibility-tree observations) are compared by the tree's
    hash: a click that left the tree and URL as they were is a no-op, the same click on the same
    tree a third time is a loop; with no hash at all nothing is either."""
    from curation.select import select
    from tests.curation.fixture import recipe_of
    from warehouse.records import Step, Trajectory
    from warehouse.versions import current_snapshot

    wh, _ = fixture_wh
    a, b = "a11y-tree-a", "a11y-tree-b"
    steps = [  # (tree, action): 0 changes nothing (no-op); 1, 2, 3 repeat on tree b (a loop)
        (a, "click(e9)"),
        (a, "click(e3)"),
        (b, "click(e3)"),
        (b, "click(e3)"),
        (b, "click(e3)"),
        (b, 'answer("done")'),
    ]
    ok = {"task_version": 1, "n_steps": 6}
    wh.write_trajectories(
        [
            Trajectory("a1", "run-expert", "task-1", "expert", "success", **ok),
            Trajectory("a2", "run-expert", "task-2", "expert", "success", **ok),
        ],
        [Step("a1", i, url="u", a11y_hash=h, action_text=act) for i, (h, act) in enumerate(steps)]
        + [Step("a2", i, url="u", action_text=act) for i, (_, act) in enumerate(steps)],
    )

    def kept(filters: str) -> dict[str, list[int]]:
        recipe = recipe_of(f"filters: [{filters}]\n")
        return kept_steps(select(wh, recipe, snapshot_id=current_snapshot(wh)))

    # the loop filter alone: step 4 is the third (tree b, click(e3))
    assert kept("{drop_loops: {max_repeats: 2}}")["a1"] == [0, 1, 2, 3, 5]
    # the no-op filter: 0 left tree a as it was, 2, 3 and 4 left tree b; 5 is the last step
    assert kept("{drop_invalid_steps: {}}")["a1"] == [1, 5]
    # a2 has no observation hash: neither filter can see anything, every step stays
    both = kept("{drop_invalid_steps: {}}, {drop_loops: {max_repeats: 1}}")
    assert both["a2"] == [0, 1, 2, 3, 4, 5]
