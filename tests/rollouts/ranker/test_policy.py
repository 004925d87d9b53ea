"""The ``ranker`` rollout policy (:mod:`rollouts.ranker.policy`): greedy and sampled choices,
top-k, batching that never changes a choice, and acting on live pages through the engine."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import numpy as np
import pytest

from rollouts.actions import ParseError, parse_action
from rollouts.policies import POLICIES, PolicyContext, make_policy
from rollouts.prompts import PromptConfig, Turn
from rollouts.ranker.policy import RankerPolicy
from tests.rollouts.ranker.fixture import INSTRUCTION, TREE, HashEncoder, run


def _act(policy: RankerPolicy, seed: int, tree: str = TREE) -> Any:
    ctx = PolicyContext(
        "t", INSTRUCTION, None, [Turn("http://h/", "T", a11y=tree)], random.Random(seed)
    )
    return asyncio.run(policy.act(ctx))


def test_policy_greedy_is_deterministic_and_sampling_varies_with_the_seed() -> None:
    assert POLICIES.factories["ranker"] is RankerPolicy
    greedy = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
    outs = [_act(greedy, s) for s in range(3)]
    assert len({o.text for o in outs}) == 1
    cands, scores = greedy.rank(outs[0].messages)
    best = int(np.argmax(scores))
    assert outs[0].action == cands[best].action
    logp = scores - np.log(np.exp(scores - scores.max()).sum()) - scores.max()
    assert outs[0].logprob == pytest.approx(logp[best], abs=1e-5) and outs[0].logprob < 0
    hot = make_policy("ranker", temperature=5.0, encoder=HashEncoder())
    sampled = [_act(hot, s) for s in range(12)]
    assert len({o.text for o in sampled}) > 3
    assert all(not isinstance(o.action, ParseError) for o in sampled)
    # the log-prob is under softmax(scores) at T=1 whatever the sampling temperature
    for o in sampled:
        i = next(k for k, c in enumerate(cands) if c.action == o.action)
        assert o.logprob == pytest.approx(logp[i], abs=1e-5)
    with pytest.raises(ValueError, match="accessibility tree"):
        RankerPolicy(prompt=PromptConfig(mode="screenshot"))


def test_top_k_lists_the_likeliest_distinct_actions_best_first() -> None:
    policy = make_policy("ranker", temperature=1.0, encoder=HashEncoder())
    ctx = PolicyContext(
        "t", INSTRUCTION, None, [Turn("http://h/", "T", a11y=TREE)], random.Random(0)
    )
    outs = asyncio.run(policy.top_k(ctx, 4))
    cands, scores = policy.rank(outs[0].messages)
    order = [int(i) for i in np.argsort(-scores, kind="stable")[:4]]
    assert [o.action for o in outs] == [cands[i].action for i in order]
    assert len({o.text for o in outs}) == 4  # distinct, where samples could repeat one action
    logps = [o.logprob for o in outs]
    assert (
        logps == sorted(logps, reverse=True)
        and logps[0]
        == _act(make_policy("ranker", temperature=0.0, encoder=HashEncoder()), 0).logprob
    )


def test_prompts_ranked_together_get_the_same_scores_as_ranked_alone() -> None:
    """Concurrent episodes share the ranker's calls (``rank_many``: one encoder call for their
    new texts); each prompt's scores are the same bits as ranking it alone, so batching never
    changes what an episode does."""
    policy = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
    instructions = [INSTRUCTION, "Search Openpedia for Hamarton", "Accept the cookies"]

    def ctx(k: int) -> PolicyContext:
        turns = [Turn("http://h/", "T", a11y=TREE)]
        return PolicyContext(f"t{k}", instructions[k % 3], None, turns, random.Random(k))

    async def together() -> list:
        return await asyncio.gather(*(policy.act(ctx(k)) for k in range(6)))

    outs = asyncio.run(together())
    ranked = policy.rank_many([o.messages for o in outs])
    for k, (out, (cands, scores)) in enumerate(zip(outs, ranked, strict=True)):
        alone = make_policy("ranker", temperature=0.0, encoder=HashEncoder())
        solo_cands, solo_scores = alone.rank(out.messages)
        assert np.array_equal(scores, solo_scores) and cands == solo_cands
        solo = asyncio.run(alone.act(ctx(k)))
        assert (solo.text, solo.logprob) == (out.text, out.logprob)
    asyncio.run(policy.aclose())


@pytest.mark.browser
def test_untrained_policy_acts_on_live_pages(chromium, server, tasks):
    policy = make_policy("ranker", seed=0, prompt=PromptConfig(mode="a11y"))
    done = run(chromium, server, policy, tasks[:2], 3)
    assert len(done) == 2
    steps = [s for f in done for s in f.steps]
    assert steps and all(s.prompt_hash for s in steps)
    for s in steps:
        assert not isinstance(parse_action(s.model_output or ""), ParseError), s.model_output
        assert s.logprob is not None and s.logprob <= 0.0
