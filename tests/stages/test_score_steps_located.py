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


def test_expert_candidates_continue_from_the_aligned_reference_step(tmp_path, sites, chromium):
    tasks = generate(1, 0, templates=["mail_archive"])  # 3 steps, no answer step
    ref = [format_action(parse_action(a)) for a in tasks[0].reference]
    assert len(ref) >= 3  # several reference steps, so a wrong cursor shows
    cfg = CollectConfig(suite="bundled", split=None, n_tasks=1, concurrency=1, run_name="refs")
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path)) as wh:
        put_tasks(wh, tasks)
        out = chromium.run(run_collect(wh, cfg, server=sites, browser=chromium.browser))
        assert out.by_status == {"success": 1}
        actions = wh.sql("SELECT action_text FROM steps ORDER BY step_idx")["action_text"]
        assert not set(actions.to_list()) & set(ref)  # model-facing, not the reference's text

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
