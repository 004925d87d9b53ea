"""Expert candidates at the states of a model-facing trajectory start from the page-state
aligned cursor: the trajectory's actions are aria refs (``click(e12)``), which never match the
reference's text, so without alignment every state's expert candidate was the first reference
action."""

from __future__ import annotations

import pytest

from rollouts.actions import format_action, parse_action
from sites.tasks import generate
from stages.collect import CollectConfig, run_collect
from stages.score_steps import ScoreStepsConfig, run_score_steps_async
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _expert_run(wh: Warehouse, tasks: list, sites, chromium) -> list[str]:
    """The expert's run ``refs`` on the one task (a success); its model-facing actions."""
    put_tasks(wh, tasks)
    cfg = CollectConfig(suite="bundled", split=None, n_tasks=1, concurrency=1, run_name="refs")
    out = chromium.run(run_collect(wh, cfg, server=sites, browser=chromium.browser))
    assert out.by_status == {"success": 1}
    return wh.sql("SELECT action_text FROM steps ORDER BY step_idx")["action_text"].to_list()


def test_expert_candidates_continue_from_the_aligned_reference_step(tmp_path, sites, chromium):
    tasks = generate(1, 0, templates=["mail_archive"])  # 3 steps, no answer step
    ref = [format_action(parse_action(a)) for a in tasks[0].reference]
    assert len(ref) >= 3  # several reference steps, so a wrong cursor shows
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path)) as wh:
        actions = _expert_run(wh, tasks, sites, chromium)
        assert not set(actions) & set(ref)  # model-facing, not the reference's text
        score = ScoreStepsConfig(run="refs", k=2, noise=0.0, concurrency=4)
        res = chromium.run(run_score_steps_async(wh, score, server=sites, browser=chromium.browser))
        assert res.errors == 0
        rows = wh.sql(
            "SELECT c.step_idx, c.action_text, s.score FROM candidates c JOIN step_scores s "
            "USING (traj_id, step_idx, cand_idx) WHERE c.cand_idx = 0 ORDER BY c.step_idx"
        ).rows()
    proposed = [a for _, a, _ in rows]
    assert proposed[0] == ref[0]
    # the last state has done the whole reference: the expert finishes (it answers "done" after
    # a reference without an answer step), instead of starting over at the first step
    assert proposed[-1] == 'answer("done")'
    assert [a for i, a in enumerate(proposed) if i == 0 or a != proposed[i - 1]] == [
        *ref,
        'answer("done")',
    ]  # every reference step proposed, in order (a state whose step was a scroll repeats it)
    assert all(score == 1.0 for *_, score in rows)  # the aligned next step always succeeds


def test_the_expert_candidate_is_the_reference_step_in_the_states_own_refs(
    tmp_path, sites, chromium
):
    """``expert_candidate``: beside the policy's candidates, the reference's next action at the
    aligned step, written in the refs of the state's stored observation. On the expert's own
    trajectory that is the action the expert took there, and it scores 1 (the reference finishes
    from it)."""
    tasks = generate(1, 0, templates=["mail_archive"])
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path)) as wh:
        taken = _expert_run(wh, tasks, sites, chromium)
        score = ScoreStepsConfig(
            run="refs", policy="random", k=2, expert_candidate=True, concurrency=4
        )
        res = chromium.run(run_score_steps_async(wh, score, server=sites, browser=chromium.browser))
        assert res.errors == 0
        rows = wh.sql(
            "SELECT c.step_idx, c.cand_idx, c.policy, c.action_text, s.score FROM candidates c "
            "JOIN step_scores s USING (traj_id, step_idx, cand_idx) ORDER BY c.step_idx, c.cand_idx"
        ).rows()
    expert = {i: (a, sc) for i, _, p, a, sc in rows if p == "expert-reference"}
    policy = {(i, a) for i, _, p, a, _ in rows if p != "expert-reference"}
    for i, action in enumerate(taken):
        if action.startswith("answer("):
            continue  # the last state: no reference step is left
        if (i, action) in policy:
            continue  # a random candidate happened to be it: not added twice
        assert expert.get(i) == (action, 1.0), (i, action, taken, rows)
    assert expert, "no state got the expert's candidate"
    assert all(c == 2 for i, c, p, *_ in rows if p == "expert-reference")  # candidate K + 1


def test_a_reference_target_maps_to_the_stored_trees_ref_by_role_and_name():
    from judging.prm import _matching_ref, _role_name

    tree = (
        '- navigation "Main" [ref=e1]:\n'
        '  - link "Inbox" [ref=e2] [cursor=pointer]\n'
        '  - link "Archive" [ref=e3] [cursor=pointer]\n'
        '- button "Archive" [ref=e7]\n'
        '- button "Delete" [ref=e8]\n'
        '- button "Delete" [ref=e9]\n'
    )
    assert _role_name('- button "Archive" [ref=e4]') == ("button", "Archive")
    # (YAML quotes a line whose name holds a '#' or a colon)
    assert _role_name("- 'link \"Budget #46\" [ref=f1e5]':") == ("link", "Budget #46")
    # the page's own ref when the stored line agrees; else the one line with that role and name
    assert _matching_ref(tree, ("button", "Archive"), "e7") == "e7"
    assert _matching_ref(tree, ("button", "Archive"), "e4") == "e7"
    assert _matching_ref(tree, ("link", "Archive"), "e7") == "e3"
    assert _matching_ref(tree, ("button", "Delete"), "e9") == "e9"
    assert _matching_ref(tree, ("button", "Delete"), "e2") is None  # two: ambiguous
    assert _matching_ref(tree, ("button", "Send"), "e5") is None
