"""Reference labels taken during a rollout (``label_reference``, :mod:`rollouts.labeller`) and the
PRM's ``reference`` scorer, which scores candidates against them with no replay: real Chromium on
the bundled sites."""

from __future__ import annotations

import pytest

from rollouts.labeller import matches_label
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
            # every state's label is what the expert did there, its closing answer included
            # (once the reference is exhausted, stopping is the right action)
            assert labels == actions and len(actions) >= 2
            assert actions[-1] == 'answer("done")'


def test_a_noisy_policy_gets_its_first_error_which_the_scorer_and_the_labels_teacher_use(
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
            off = [i for i, (a, lab) in pairs if lab and not matches_label(a, lab)]
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
        assert score == (1.0 if matches_label(action, label) else 0.0)
        if policy == "expert-reference":
            assert action == label and score == 1.0
    assert {s for *_, s, _, _ in got} == {0.0, 1.0}
    _labels_teacher(tmp_path, run_id)
    _a_plugin_scorer(tmp_path, run_id, chromium)


def _a_plugin_scorer(home, run_id: str, chromium) -> None:
    """A PRM scorer from a module of the user's own runs through the stage by name, on the
    candidates stored above; the registries are as they were afterwards."""
    import sys

    from judging.prm import SCORERS, SPECS
    from stages.plugins import load_plugins

    specs, factories = dict(SPECS), dict(SCORERS.factories)
    try:
        load_plugins("tests.judging.plugin_scorer")
        assert SPECS["brevity"].needs == frozenset()
        with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
            cfg = ScoreStepsConfig(run=run_id, scorer="brevity", policy="random", k=2)
            res = chromium.run(run_score_steps_async(wh, cfg))
            got = wh.sql(
                "SELECT c.action_text, s.score FROM candidates c JOIN step_scores s "
                "USING (traj_id, step_idx, cand_idx) WHERE s.scorer = 'brevity'"
            ).rows()
        assert res.errors == 0 and len(got) >= res.selected > 0
        for action, score in got:
            assert score == (1 / (1 + len(action)) if action else 0.0)
    finally:
        SPECS.clear(), SPECS.update(specs)
        SCORERS.factories.clear(), SCORERS.factories.update(factories)
        sys.modules.pop("tests.judging.plugin_scorer", None)


def _labels_teacher(home, run_id: str) -> None:
    """``intervene --teacher labels``: each failure's first error and the label there, no
    browser; resumable; a dataset of the prefixes plus those corrections."""
    import pyarrow.parquet as pq

    from curation.build import build_dataset
    from curation.recipe import parse_recipe
    from stages.intervene import InterveneConfig, run_intervene
    from training.data import find_dataset

    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        cfg = InterveneConfig(teacher="labels", run=run_id)
        res = run_intervene(wh, cfg)
        failed = wh.sql(
            "SELECT traj_id, meta FROM trajectories WHERE run_id = ? AND status = 'failure'",
            [run_id],
        ).rows()
        assert res.selected == len(failed) > 0 and res.errors == 0
        iv = {
            r[0]: r[1:]
            for r in wh.sql(
                "SELECT traj_id, first_error_step, proposed_action, verified, verified_outcome "
                "FROM interventions WHERE proposer = 'labels'"
            ).rows()
        }
        corrected = {}
        for traj_id, m in failed:
            meta = _meta(m)
            step, proposed, verified, outcome = iv[traj_id]
            if meta["first_error"] is None:
                assert outcome == "no_error_found" and step is None and verified is None
                continue
            label = meta["reference_labels"][meta["first_error"]]
            assert (step, _meta(proposed)["text"], verified) == (meta["first_error"], label, True)
            corrected[traj_id] = (step, label)
        assert res.verified == len(corrected) >= 3
        assert run_intervene(wh, cfg).selected == 0  # settled: a re-run selects nothing
        recipe = parse_recipe(
            "name: corrected\n"
            f"sources: {{splits: [train, test, ood], runs: [{run_id}]}}\n"
            "filters: [{before_first_error: {}}]\n"
            "include: {interventions: true}\n"
            "output: {sft: true, rl_groups: false, preferences: false, k_images: 1}\n"
            "gates: {success_rate: [0.0, 1.0]}\n",
            "corrected.yaml",
        )
        ds = build_dataset(wh, recipe, out_dir=home / "ds", blobs=wh.blobs, progress=None)
        export = find_dataset(wh, ds.dataset_id).export_path
    rows = pq.read_table(export / "parquet" / "sft.parquet").to_pylist()
    fixes = {(r["traj_id"], r["step_idx"]): r["completion"] for r in rows}
    for traj_id, (step, label) in corrected.items():
        # the failure's steps before its first error, then the label where it erred
        assert fixes[(traj_id, step)].endswith(f"Action: {label}")
        kept = sorted(i for t, i in fixes if t == traj_id)
        assert kept == list(range(step + 1))
