"""Process rewards: advantages, ranking agreement, the VLM scorer over HTTP, and the exact
replay scorer on real pages of the bundled sites."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from judging.base import TrajectoryView
from judging.prm import (
    Proposal,
    State,
    advantages,
    make_scorer,
    parse_score,
    propose,
    ranking_agreement,
)
from rollouts.actions import format_action, parse_action
from rollouts.policies import ExpertPolicy
from sites.tasks import generate
from tests.judging.conftest import store_trajectory
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from warehouse.records import Step, Trajectory


def test_group_relative_advantages():
    adv = advantages([1.0, 0.0, 0.5, None])
    # mean .5, population std sqrt(1/6), plus eps 1e-6 (warehouse.advantage, as training's)
    assert adv[0] == pytest.approx(0.5 / ((1 / 6) ** 0.5 + 1e-6), rel=1e-12)
    assert adv[1] == pytest.approx(-adv[0])
    assert adv[2] == 0.0 and adv[3] is None
    assert advantages([0.3, 0.3]) == [0.0, 0.0]
    assert advantages([None, None]) == [None, None]


def test_ranking_agreement_hand_computed():
    ref = {("t", 0): {0: 1.0, 1: 0.0, 2: 0.0}, ("t", 1): {0: 0.0, 1: 1.0}, ("u", 0): {0: 1.0}}
    pred = {("t", 0): {0: 0.9, 1: 0.2, 2: 0.95}, ("t", 1): {0: 0.1, 1: 0.8}, ("u", 0): {0: 0.5}}
    out = ranking_agreement(pred, ref)
    # pairs the reference separates: (0,1) ok, (0,2) wrong; state 1: (0,1) ok -> 2/3
    assert out["states"] == 2 and out["pairs"] == 3
    assert out["pairwise_accuracy"] == pytest.approx(2 / 3)
    assert out["top1_agreement"] == pytest.approx(0.5)  # state 0 picks cand 2 (a ref loser)


def test_parse_score():
    assert parse_score("Thought: fine.\nScore: 7") == pytest.approx(0.7)
    for bad in ("seven", "Score: 11", ""):
        with pytest.raises(ValueError):
            parse_score(bad)


def test_vlm_scorer_over_http_scores_errors_and_advantages(wh):
    store_trajectory(wh, "x", n_steps=3, rubric=["a"])
    from judging.base import load_views

    state = State(load_views(wh, ["x"])[0], 2)

    def reply(body):
        text = last_user_text(body)
        cand = re.search(r"<untrusted>\n(.*?)\n</untrusted>", text, re.S).group(1)
        return {"click(1, 2)": "Score: 8", "scroll(down)": "Score: 3"}.get(cand, "no idea")

    cands = [
        Proposal(0, "", "click(1, 2)"),
        Proposal(1, "", "scroll(down)"),
        Proposal(2, "?", None),
    ]
    with FakeOpenAI([], default=("fn", reply)) as fake:
        scorer = make_scorer("vlm", base_url=fake.url, model="prm", backoff_s=0.01)
        results = asyncio.run(scorer.score(state, cands))
    assert [r.score for r in results] == [pytest.approx(0.8), pytest.approx(0.3), None]
    assert "no 'Score: N'" in results[2].error
    req = fake.requests[0]
    assert "process reward model" in req["messages"][0]["content"]
    text = last_user_text(req)
    assert "Task: Do the thing for t1" in text and "Previous actions:\n1. click(100, 200)" in text
    imgs = [c for c in req["messages"][1]["content"] if c.get("type") == "image_url"]
    assert len(imgs) == 1  # the current screenshot (k_images=1)
    adv = advantages([r.score for r in results])  # mean .55, std .25: +-.25 / (.25 + 1e-6)
    assert adv[0] == pytest.approx(0.25 / (0.25 + 1e-6), rel=1e-12)
    assert adv[1] == pytest.approx(-adv[0]) and adv[2] is None


# -- exact replay on real pages -----------------------------------------------------------------


def _task(template: str):
    return next(t for t in generate(13, 0) if (t.meta or {}).get("template") == template)


def _view(task, upto: int) -> TrajectoryView:
    steps = [
        Step("traj", i, action_text=format_action(parse_action(a)))
        for i, a in enumerate(task.reference[: upto + 1])
    ]
    record = Trajectory("traj", "run", task.task_id, "expert", "failure")
    return TrajectoryView(record, task, steps)


async def _score_exact(server, browser, jobs: list[tuple[State, list[str | None]]]):
    """The exact scorer (one instance, so the task's reference path is recorded once) with three
    environments on ``browser`` (contexts of the shared Chromium): each state's candidates, all
    states at once. Candidates that leave the reference's page make its next action wait for
    an element that is not there: a 5 s action timeout (not 10) bounds that wait."""
    from rollouts.browser import SharedSlot
    from rollouts.env import BrowserEnv, EnvConfig, origin_of
    from sites.tasks import resolve_start_url
    from stages.score_steps import bundled_grade

    async with httpx.AsyncClient() as client:
        slot = SharedSlot(browser)

        def resolve(t):
            url = resolve_start_url(t.start_url, server.urls)
            return url, [origin_of(url)]

        envs = [BrowserEnv(slot, EnvConfig(action_timeout_s=5)) for _ in range(3)]
        scorer = make_scorer(
            "exact", envs=envs, resolve=resolve, grade=bundled_grade(server, client)
        )
        try:
            return await asyncio.gather(
                *(
                    scorer.score(state, [Proposal(i, t or "garbage", t) for i, t in enumerate(ts)])
                    for state, ts in jobs
                )
            )
        finally:
            for env in envs:
                await env.close()


@pytest.mark.browser
def test_exact_scorer_progress_beats_no_progress_on_real_pages(server, chromium):
    task = _task("shop_add_to_cart")
    ref = task.reference
    # state: the product page, about to choose the colour (step 5 of 8)
    state = State(_view(task, 5), 5)
    assert state.cursor() == 5
    right = format_action(parse_action(ref[5]))
    # and the last step: adding to the cart is progress the checker sees right away
    last = State(_view(task, 7), 7)
    results, res = chromium.run(
        _score_exact(
            server,
            chromium.browser,
            [
                (state, [right, "scroll(down)", 'answer("done")', None, right, "back()"]),
                (last, [format_action(parse_action(ref[7])), "wait()"]),
            ],
        )
    )
    scores = [r.score for r in results]
    assert all(r.error is None for r in results), [r.error for r in results]
    assert scores[0] == 1.0 and scores[4] == 1.0  # the right step: the reference then finishes
    assert max(scores[1], scores[2], scores[3], scores[5]) < scores[0]
    assert results[0].detail["cursor"] == 5 and results[0].detail["continued"] == 2
    assert results[3].detail["candidate"] is None  # unparseable = a no-op
    assert res[0].score == 1.0 and res[0].detail["immediate"] == 1.0
    assert res[1].score < 1.0 and res[1].detail["immediate"] < 1.0


def test_expert_candidates_start_at_the_prefix_cursor():
    task = _task("wiki_fact")
    state = State(_view(task, 1), 1)
    props = asyncio.run(propose(ExpertPolicy(noise=0.0), state, 3))
    expected = format_action(parse_action(task.reference[1]))
    assert [p.action_text for p in props] == [expected] * 3
    noisy = asyncio.run(propose(ExpertPolicy(noise=1.0), state, 6, rng_seed=3))
    assert any(p.action_text != expected for p in noisy)


def test_the_scorers_say_what_they_need():
    from judging.prm import SPECS, needs, register, scorer_spec

    assert {n: sorted(s.needs) for n, s in SPECS.items()} == {
        "exact": ["bundled", "replay"],
        "reference": ["bundled", "labels"],
        "vlm": ["endpoint"],
    }
    assert [n for n, s in sorted(SPECS.items()) if s.expert_candidate] == ["exact", "reference"]
    assert scorer_spec("exact").summary.startswith("Ground truth on the bundled sites")
    assert needs("reference", "labels") and not needs("vlm", "labels") and not needs("x", "labels")
    with pytest.raises(ValueError, match="unknown PRM scorer 'x'; known: exact, reference, vlm"):
        scorer_spec("x")
    with pytest.raises(ValueError, match=r"unknown need\(s\) \['gpu'\]"):
        register("fast", needs=("gpu",))
    with pytest.raises(ValueError, match="PRM scorer 'vlm' is registered already"):

        @register("vlm")
        class Other:  # pragma: no cover - refused at registration
            pass


def test_the_judges_say_what_they_need():
    from judging.base import SPECS, judge_needs, register
    from judging.rubric_vlm import TEMPLATE_HASH

    assert {n: sorted(s.needs) for n, s in SPECS.items()} == {
        "programmatic": ["checkers"],
        "rubric_vlm": ["endpoint"],
        "outcome_vlm": ["endpoint"],
        "ensemble": ["members"],
    }
    assert SPECS["rubric_vlm"].options == ("base_url", "model", "k", "selection")
    assert SPECS["rubric_vlm"].prompts == TEMPLATE_HASH and SPECS["programmatic"].prompts is None
    assert judge_needs("programmatic", "checkers") and not judge_needs("nope", "checkers")
    with pytest.raises(ValueError, match="judge 'programmatic' is registered already"):

        @register("programmatic")
        class Other:  # pragma: no cover - refused at registration
            pass
