"""RL's log-prob parity check (``stages.served.ServedCheckpoints.parity``) against both engines:
the server's log-probs of the tokens it chose equal the trainer's for the same tokens when the
trainer holds the served weights, and the check stops the run when it holds others (what weights
that did not arrive, or a drifted tokenizer or chat template, look like)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from rollouts.prompts import DATA_URL, render
from stages.served import ParityError, ServedCheckpoints
from tests.serving.test_protocol import ENGINES, WITH_IMAGE
from tests.serving.vllm_tier import NAME
from training.interface import Turn

TOL = 1e-4  # float32 on both sides (see test_vllm_tier's docstring for the measured gap)


def turns() -> list[Turn]:
    png = base64.b64decode(WITH_IMAGE[0]["content"][0]["image_url"]["url"][len(DATA_URL) :])
    text_only = [{"role": "user", "content": "Task: open the inbox. Action:"}]
    return [Turn(render(WITH_IMAGE), "x", (png,), key="img"), Turn(render(text_only), "x")]


@pytest.mark.parametrize("engine", ENGINES)
def test_parity_holds_for_the_served_weights_and_fails_for_others(engine, server_of, tmp_path):
    from training.models import build_tiny_idefics
    from training.vlm import VLMTrainable

    served = ServedCheckpoints(engine=engine, parity_tol=TOL)
    served.server = server_of  # the session's server (not stopped here)
    assert served.server.spec.served_name == NAME
    same = VLMTrainable.load(served.server.spec.model)
    parity = served.parity(same, turns())
    assert parity.prompts == 2 and parity.tokens == 2 * served.parity_tokens
    assert parity.max_abs_diff < TOL
    print(f"{engine}: parity over {parity.tokens} tokens, max |diff| {parity.max_abs_diff:.2e}")
    other = VLMTrainable.load(build_tiny_idefics(tmp_path / "other", seed=1))
    with pytest.raises(ParityError, match=r"token 0 .* of the reply to turn img: server"):
        served.parity(other, turns())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_served_rollout_records_the_ids_the_server_sampled(engine, server_of):
    """An ``openai`` policy asking for token ids (as RL's served rollouts do) records the ids
    the engine sampled: the trainer holding the served weights gives them the server's
    log-probs, and a turn carrying them trains on exactly them."""
    import asyncio
    import random

    from rollouts.policies import OpenAIPolicy, PolicyContext
    from rollouts.prompts import Turn as Observation
    from training.vlm import VLMTrainable

    png = base64.b64decode(WITH_IMAGE[0]["content"][0]["image_url"]["url"][len(DATA_URL) :])
    obs = [Observation("http://mail.test/", "Inbox", png, '- link "Inbox" [ref=e2]')]
    ctx = PolicyContext("t", "Open the inbox", None, obs, random.Random(0))
    policy = OpenAIPolicy(
        server_of.base_url, NAME, max_tokens=8, temperature=1.0, seeded=True, token_ids=True
    )

    async def act() -> Any:
        try:
            return await policy.act(ctx)
        finally:
            await policy.aclose()

    out = asyncio.run(act())
    assert out.token_ids and out.messages is not None and out.logprob is not None
    trainable = VLMTrainable.load(server_of.spec.model).train(False)
    turn = Turn(render(out.messages), out.text, (png,), reply_ids=out.token_ids)
    ids = [i for i in out.token_ids if i != trainable.end_id]
    assert trainable.encode(turn).reply_ids == [*ids, trainable.end_id]
    mine = trainable.token_logprobs(turn, ids)
    assert sum(mine) == pytest.approx(out.logprob, abs=1e-3)
