"""Reference labels taken during a rollout (``label_reference``, :mod:`rollouts.labeller`) and the
PRM's ``reference`` scorer, which scores candidates against them with no replay: real Chromium on
the bundled sites."""

from __future__ import annotations

import pytest

from sites.tasks import generate
from stages.collect import CollectConfig, run_collect
from stages.score_steps import ScoreStepsConfig, run_score_steps_async
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _collect(wh: Warehouse, sites, chromium, name: str, **changes) -> list[tuple]:
    cfg = CollectConfig(
        suite="bundled",
        split=None,
        concurrency=2,
        run_name=name,
        action_timeout_s=1.5,
        engine={"label_reference": True},
        **changes,
    )
    chromium.run(run_collect(wh, cfg, server=sites, browser=chromium.browser))
    return wh.sql(
        "SELECT traj_id, status, meta FROM trajectories WHERE run_id = "
        "(SELECT run_id FROM runs WHERE name = ?) ORDER BY traj_id",
        [name],
    ).rows()


def _actions(wh: Warehouse, traj_id: str) -> list[str | None]:
    return wh.sql("SELECT action_text FROM steps WHERE traj_id = ? ORDER BY step_idx", [traj_id])[
        "action_text"
    ].to_list()


def _meta(m) -> dict:
    import json

    return json.loads(m) if isinstance(m, str) else m


def test_the_flawless_expert_follows_every_label(tmp_path, sites, chromium):
    tasks = generate(2, 0, templates=["mail_archive", "shop_add_to_cart"])
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path)) as wh:
        put_tasks(wh, tasks)
        rows = _collect(wh, sites, chromium, "clean", n_tasks=2)
        assert [s for _, s, _ in rows] == ["success", "success"]
        for traj_id, _, m in rows:
            meta, actions = _meta(m), _actions(wh, traj_id)
            labels = meta["reference_labels"]
            assert len(labels) == len(actions) and meta["first_error"] is None
            # every labelled state's label is what the expert did there; the states after the
            # reference is exhausted (the expert's closing answer) have none
            assert [a for a, lab in zip(actions, labels, strict=True) if lab] == [
                lab for lab in labels if lab
            ]
            assert sum(lab is not None for lab in labels) >= len(actions) - 1 >= 2


def test_a_noisy_policy_gets_its_first_error_and_the_reference_scorer_scores_it(
    tmp_path, sites, chromium
):
    tasks = generate(8, 0, templates=["shop_add_to_cart", "mail_compose"])
    with Warehouse.open(WarehouseConfig.from_env(home=tmp_path)) as wh:
        put_tasks(wh, tasks)
        rows = _collect(wh, sites, chromium, "noisy", n_tasks=8, noise=0.6, seed=4)
        erred = 0
        for traj_id, _, m in rows:
            meta, actions = _meta(m), _actions(wh, traj_id)
            labels, first = meta["reference_labels"], meta["first_error"]
            pairs = enumerate(zip(actions, labels, strict=True))
            off = [i for i, (a, lab) in pairs if lab and a != lab]
            # the first error is the first labelled state where the policy did otherwise
            assert first == (off[0] if off else None), (actions, labels)
            erred += first is not None
        assert erred >= 3
        run_id = wh.sql("SELECT run_id FROM runs WHERE name = 'noisy'").item()
        cfg = ScoreStepsConfig(
            run=run_id, scorer="reference", policy="random", k=2, expert_candidate=True,
            select="first_error",
        )  # fmt: skip
        # no sites server and no browser: the reference scorer replays nothing
        res = chromium.run(run_score_steps_async(wh, cfg))
        assert res.errors == 0 and res.selected > 0
        got = wh.sql(
            "SELECT c.traj_id, c.step_idx, c.policy, c.action_text, s.score, "
            "t.status, t.meta FROM candidates c JOIN step_scores s USING (traj_id, step_idx, "
            "cand_idx) JOIN trajectories t USING (traj_id) WHERE s.scorer = 'reference'"
        ).rows()
    assert got
    for _traj_id, step, policy, action, score, status, m in got:
        meta = _meta(m)
        label = meta["reference_labels"][step]
        assert status != "success" and step >= meta["first_error"]  # first_error selection
        assert score == (1.0 if action == label else 0.0)
        if policy == "expert-reference":
            assert action == label and score == 1.0
    assert {s for *_, s, _, _ in got} == {0.0, 1.0}
