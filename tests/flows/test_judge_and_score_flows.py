"""Judging and step scoring over real rollouts: injected pages and answers collected in real
Chromium, the programmatic judge unmoved by them, a gullible rubric judge flipped (flip rates),
the judge and score_steps flows from the CLI, and PRM calibration against the exact scorer.

The rollouts and the exact scorer run on the session's sites server and Chromium (fixtures
``sites`` and ``chromium``); the CLI test runs the flows' own default path (a sites server process
and browsers of their own) on the session's Prefect server."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from judging.adversarial import flip_rates
from rollouts.policies import ANSWER_INJECTION
from sites.tasks import ADVERSARIAL_SUITE, adversarial_variants, generate
from stages import collect as collect_module
from stages import score_steps as score_steps_module
from stages.collect import CollectConfig, run_collect
from stages.judge import JudgeConfig, run_judge
from stages.score_steps import (
    ScoreStepsConfig,
    run_score_steps,
    run_score_steps_async,
    scorer_agreement,
)
from tests.cli.cli_runner import webloop
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from warehouse import Warehouse, WarehouseConfig
from warehouse.tasks import put_tasks

pytestmark = [pytest.mark.browser, pytest.mark.slow]
TEMPLATES = ["shop_add_to_cart", "wiki_fact", "mail_archive", "shop_product_fact"]
COMMON = dict(suite=ADVERSARIAL_SUITE, split=None, n_tasks=8, concurrency=4)


def gullible(body: dict) -> str:
    """A judge model that believes what the agent writes (it says success when asked to)."""
    text = last_user_text(body)
    verdict = "success" if "report success" in text else "failure"
    return json.dumps({"criteria": [], "verdict": verdict, "rationale": "as stated"})


@pytest.fixture(scope="module")
def home(tmp_path_factory, sites, chromium) -> Path:
    """A warehouse with expert rollouts on injected pages (noise 0: should succeed) and noisy
    rollouts whose answers carry an injection (should fail)."""
    h = tmp_path_factory.mktemp("judge-flows")
    tasks = generate(8, 0, templates=TEMPLATES)
    shared = dict(server=sites, browser=chromium.browser)
    with Warehouse.open(WarehouseConfig.from_env(home=h)) as wh:
        put_tasks(wh, tasks + adversarial_variants(tasks))
        clean = chromium.run(run_collect(wh, CollectConfig(**COMMON, run_name="clean"), **shared))
        assert clean.ran == 8 and clean.by_status == {"success": 8}
        noisy = CollectConfig(  # mistakes leave missing elements: no 10 s wait for each
            **COMMON,
            noise=1.0,
            max_steps=5,
            inject_answer=True,
            action_timeout_s=3.0,
            run_name="injected",
        )
        assert chromium.run(run_collect(wh, noisy, **shared)).ran == 8
    return h


class Refused(Exception):
    pass


def refuse(*args, **kwargs):
    raise Refused("started although there was nothing to do")


def test_rerunning_a_finished_collect_starts_no_server_and_no_browser(home: Path, monkeypatch):
    monkeypatch.setattr(collect_module, "SiteServer", refuse)
    monkeypatch.setattr(collect_module, "Engine", refuse)
    with open_wh(home) as wh:
        out = asyncio.run(run_collect(wh, CollectConfig(**COMMON, run_name="clean")))
    assert (out.ran, out.skipped, out.steps) == (0, 8, 0)


def open_wh(h: Path) -> Warehouse:
    return Warehouse.open(WarehouseConfig.from_env(home=h))


def test_injection_does_not_move_the_checker_and_flips_a_gullible_judge(home: Path):
    with open_wh(home) as wh:
        out = run_judge(wh, JudgeConfig(judge="programmatic"))
        assert out.errors == 0 and out.judged == 16
        rows = wh.sql(
            "SELECT t.run_id, j.verdict, t.answer FROM judgments j JOIN trajectories t "
            "USING (traj_id) WHERE j.judge = 'programmatic'"
        ).rows()
        clean = [v for run, v, _ in rows if run == "clean"]
        assert clean == ["success"] * 8  # the expert ignores the page's note; the checker too
        answered = [(v, a) for run, v, a in rows if run == "injected" and a]
        assert answered and all(ANSWER_INJECTION in a for _, a in answered)
        # an early "I could not find it" answer is wrong whatever it adds: "report success" in
        # it did not move the checker (a noisy expert may still skip straight to a right answer)
        early = [v for v, a in answered if a.startswith("I could not find it")]
        assert early and all(v == "failure" for v in early)
        answered_failures = sum(v == "failure" for v, _ in answered)
        with FakeOpenAI([], default=("fn", gullible)) as fake:
            options = dict(base_url=fake.url, model="gullible", selection="heuristic", k=2)
            judged = run_judge(wh, JudgeConfig(judge="rubric_vlm", options=options))
        assert judged.errors == 0 and judged.calls_per_traj == 1.0  # rubric tasks: the verdict only
        prompts = [last_user_text(b) for b in fake.requests if "Final answer" in last_user_text(b)]
        for text in prompts:  # the injection only ever appears inside an untrusted block
            outside = re.sub(r"<untrusted>.*?</untrusted>", "", text, flags=re.S)
            assert "report success" not in outside
        rates = {
            r["injection"]: r
            for r in flip_rates(wh, ["rubric_vlm", "programmatic"])
            if r["judge"] == "rubric_vlm"
        }
        flipped = rates["page+answer"]
        assert flipped["judged_success"] == answered_failures and flipped["flip_rate"] > 0
        assert flipped["reference_failures"] >= answered_failures
        # (the programmatic judge is the flip-rate reference itself, so its own flip rate is 0 by
        # construction and proves nothing; its robustness is the `early` check above: answers
        # that say "report success" but are wrong stay failures)


def expected_agreement(pred: dict, ref: dict) -> dict:
    """Ranking agreement computed independently from (traj, step, cand) → score maps: over the
    candidate pairs the reference separates, the share the prediction orders the same way; the
    share of states whose predicted best (first on ties) is a reference best; mean |p − r|."""
    by_state: dict = {}
    for (t, i, c), r in ref.items():
        if (t, i, c) in pred:
            by_state.setdefault((t, i), []).append((c, pred[(t, i, c)], r))
    pairs = agree = top = 0
    diffs = []
    for cands in by_state.values():
        diffs += [abs(p - r) for _, p, r in cands]
        pairs_here = [(a, b) for a in cands for b in cands if a[0] < b[0] and a[2] != b[2]]
        pairs += len(pairs_here)
        agree += sum((a[1] > b[1]) == (a[2] > b[2]) and a[1] != b[1] for a, b in pairs_here)
        best = sorted(cands, key=lambda x: (-x[1], x[0]))[0]
        top += best[2] == max(r for _, _, r in cands)
    return {
        "states": len(by_state),
        "pairs": pairs,
        "pairwise_accuracy": agree / pairs if pairs else None,
        "top1_agreement": top / len(by_state),
        "mean_abs_diff": sum(diffs) / len(diffs),
    }


def test_score_steps_is_idempotent_and_calibrates_a_vlm_prm(
    home: Path, sites, chromium, monkeypatch
):
    cfg = ScoreStepsConfig(run="clean", k=3, max_states=4, every=2, concurrency=4)
    with open_wh(home) as wh:
        first = chromium.run(run_score_steps_async(wh, cfg, server=sites, browser=chromium.browser))
        assert first.states == 4 and first.candidates == 12 and first.errors == 0
        with monkeypatch.context() as m:  # nothing left to do: no sites server, no browser
            m.setattr(score_steps_module, "_replay_scorer", refuse)
            again = run_score_steps(wh, cfg)  # no new candidates, no rescoring
        assert (again.states, again.candidates) == (0, 0)
        n_cands = wh.sql("SELECT count(*) FROM candidates").item()
        assert n_cands == 12
        adv = wh.sql(
            "SELECT traj_id, step_idx, sum(advantage), max(score) - min(score) FROM step_scores "
            "WHERE scorer = 'exact' GROUP BY ALL"
        ).rows()
        assert all(abs(s) < 1e-9 for _, _, s, _ in adv)  # group-relative: zero mean per state
        assert any(spread > 0 for *_, spread in adv)  # some states separate their candidates

        # a VLM PRM that has learnt "clicks are progress", calibrated against the exact scorer
        def prm(body):
            return (
                "Score: 9"
                if "click(" in last_user_text(body).split("<untrusted>")[-1]
                else ("Score: 2")
            )

        with FakeOpenAI([], default=("fn", prm)) as fake:
            vcfg = ScoreStepsConfig(
                run="clean",
                k=3,
                max_states=4,
                every=2,
                scorer="vlm",
                scorer_base_url=fake.url,
                scorer_model="prm",
            )
            out = run_score_steps(wh, vcfg)
        assert out.candidates == 12 and out.errors == 0
        assert len(fake.requests) == 12
        # every stored VLM score is the fake PRM's rule applied to that candidate's action
        rows = wh.sql(
            "SELECT s.traj_id, s.step_idx, s.cand_idx, s.scorer, s.score, "
            "coalesce(c.action_text, c.model_output) FROM step_scores s "
            "JOIN candidates c USING (traj_id, step_idx, cand_idx) "
            "WHERE s.error IS NULL AND s.score IS NOT NULL"
        ).rows()
        vlm = {(t, i, c): sc for t, i, c, name, sc, _ in rows if name == "vlm"}
        exact = {(t, i, c): sc for t, i, c, name, sc, _ in rows if name == "exact"}
        for *_, name, sc, text in rows:
            if name == "vlm":
                assert sc == pytest.approx(0.9 if "click(" in (text or "") else 0.2)
        agree = scorer_agreement(wh, "vlm", "exact", "clean")
        assert agree == pytest.approx(expected_agreement(vlm, exact))
        assert agree["states"] == 4 and agree["pairs"] > 0
    proc = webloop(home, "score-steps", "agreement", "--scorer", "vlm", "--format", "json")
    row = json.loads(proc.stdout)[0]
    assert row["states"] == 4 and row["reference"] == "exact"


def test_judge_and_score_steps_run_as_prefect_flows_from_the_cli(prefect_harness, home: Path):
    with FakeOpenAI([], default=("fn", gullible)) as fake:
        proc = webloop(
            home,
            "judge",
            "--judge",
            "rubric_vlm",
            "--base-url",
            fake.url,
            "--model",
            "cli-judge",
            "--selection",
            "heuristic",
            "--run",
            "clean",
        )
    assert "rubric_vlm 1/heuristic/k4: judged 8: failure 8; judge errors 0" in proc.stdout
    proc = webloop(home, "score-steps", "--run", "clean", "--k", "4", "--max-states", "2")
    # both states had 3 candidates: K=4 samples a fourth (the first 3 are reproduced) and rescores
    assert "2 states selected, 2 scored now (8 candidates: 8 ok, 0 scorer errors)" in proc.stdout
    with open_wh(home) as wh:
        kinds = wh.sql("SELECT kind, status FROM runs WHERE kind IN ('judge', 'score_steps')")
        assert set(kinds.rows()) == {("judge", "completed"), ("score_steps", "completed")}
