"""Sampling in the in-process generator, the hf policy and serve-model (tiny offline Qwen2-VL):
temperature 0 is greedy, seeded samples reproduce whatever they are batched with, different
seeds differ, log-probs are the untempered model's."""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from rollouts.actions import format_action
from rollouts.hf import (
    HFGenerator,
    HFPolicy,
    Sampling,
    image_token_id,
    load_model,
    model_inputs,
    token_runs,
)
from rollouts.policies import PolicyContext
from rollouts.prompts import Turn, build_messages


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 40), color).save(buf, format="PNG")
    return buf.getvalue()


OBS = [
    Turn("http://shop.test/", "Shop", png((200, 30, 30)), None, "click(e1)"),
    Turn("http://shop.test/k", "Kettles", png((30, 200, 30)), '- button "Add" [ref=e3]'),
]
MESSAGES = build_messages("Add the blue kettle to the cart", OBS)


@pytest.fixture(scope="module")
def gen(tiny: Path) -> HFGenerator:
    model, proc = load_model(tiny)
    return HFGenerator(model, proc, max_batch=16, wait_s=0.05)


def gather(gen: HFGenerator, kws: list[dict[str, Any]], n: int = 12) -> list[Any]:
    async def go() -> list[Any]:
        return await asyncio.gather(*(gen.generate(MESSAGES, n, **kw) for kw in kws))

    return asyncio.run(go())


def test_temperature_zero_is_greedy(gen):
    [greedy] = gen.run_batch([MESSAGES], 12)
    out = gather(gen, [{}, {"temperature": 0.0, "seed": 3}])
    assert [g.text for g in out] == [greedy.text, greedy.text]
    # top_p so small that only the most likely token is left: sampling equals greedy
    nucleus = gather(gen, [{"temperature": 1.0, "top_p": 1e-6, "seed": s} for s in range(3)])
    assert {g.text for g in nucleus} == {greedy.text}


def test_seeds_differ_and_reproduce_whatever_the_batch(gen):
    kws = [{"temperature": 1.0, "seed": s} for s in range(8)]
    first = gather(gen, kws)
    assert len({g.text for g in first}) >= 4, [g.text for g in first]
    batches = gen.batches
    # the same seeds again, now mixed with greedy and other-temperature requests in one batch
    mixed = gather(gen, [{}, *kws[::-1], {"temperature": 0.7, "seed": 99}])
    assert gen.batches == batches + 1  # all in one batch
    assert [g.text for g in mixed[1:9]] == [g.text for g in first][::-1]
    alone = gather(gen, [kws[5]])
    assert alone[0].text == first[5].text


def test_reported_logprobs_are_the_untempered_model_distribution(gen):
    # temperature 2 with a nucleus of one token: the greedy tokens, drawn by the sampler
    [g] = gather(gen, [{"temperature": 2.0, "top_p": 1e-6, "seed": 7}], n=6)
    inputs = model_inputs(gen.processor, [MESSAGES])
    n = inputs["input_ids"].shape[1]
    with torch.no_grad():
        seq = gen.model.generate(**inputs, max_new_tokens=6, do_sample=False)
        ids = seq[0, n:].tolist()[: g.completion_tokens]
        types = torch.zeros_like(seq)
        types[:, :n] = inputs["mm_token_type_ids"]
        logits = (
            gen.model(
                input_ids=seq,
                attention_mask=torch.ones_like(seq),
                pixel_values=inputs["pixel_values"],
                image_grid_thw=inputs["image_grid_thw"],
                mm_token_type_ids=types,
            )
            .logits[0]
            .float()
        )
    assert g.completion_tokens == len(ids) > 0
    got = [v for _, v in g.token_logprobs]
    plain = torch.log_softmax(logits, -1)
    tempered = torch.log_softmax(logits / 2.0, -1)
    assert got == pytest.approx([float(plain[n - 1 + k, t]) for k, t in enumerate(ids)], abs=1e-4)
    assert got[0] != pytest.approx(float(tempered[n - 1, ids[0]]), abs=1e-3)


def test_per_request_token_limits_hold_in_a_shared_batch(gen):
    out = asyncio.run(
        _both(gen, [(MESSAGES, 3, {"temperature": 1.0, "seed": 1}), (MESSAGES, 16, {})])
    )
    assert out[0].completion_tokens <= 3 and out[1].completion_tokens <= 16


async def _both(gen: HFGenerator, reqs: list[tuple]) -> list[Any]:
    return await asyncio.gather(*(gen.generate(m, n, **kw) for m, n, kw in reqs))


def test_sampling_parameters_are_validated():
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=0)
    with pytest.raises(ValueError, match="top_p"):
        HFPolicy(generator=object(), top_p=1.5)  # type: ignore[arg-type]


def ctx(seed: int) -> PolicyContext:
    return PolicyContext("t", "Add the blue kettle to the cart", None, OBS, random.Random(seed))


def act_all(policy: HFPolicy, seeds: list[int]) -> list[str]:
    async def go() -> list[str]:
        outs = await asyncio.gather(*(policy.act(ctx(s)) for s in seeds))
        return [o.text for o in outs]

    return asyncio.run(go())


def test_hf_policy_group_samples_differ_and_a_run_reproduces(gen):
    sampled = HFPolicy(generator=gen, max_new_tokens=12, temperature=1.0)
    group = act_all(sampled, list(range(8)))  # 8 samples of one task: 8 episode rngs
    assert len(set(group)) >= 4
    assert act_all(sampled, list(range(8))) == group  # the same run again
    greedy = act_all(HFPolicy(generator=gen, max_new_tokens=12), [0, 1, 2])
    assert len(set(greedy)) == 1


def test_serve_model_passes_sampling_through(tiny):
    from starlette.testclient import TestClient

    from serving.server import build_app, sampling_of

    assert sampling_of({"temperature": 0.5, "top_p": 0.9, "seed": 4}) == {
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 4,
    }
    for bad in ({"temperature": "hot"}, {"seed": 1.5}, {"top_p": 0}, {"temperature": True}):
        with pytest.raises(ValueError):
            sampling_of(bad)
    text = [{"role": "user", "content": "Say hi"}]
    with TestClient(build_app(str(tiny), "tiny")) as client:

        def ask(**kw: Any) -> Any:
            body = {"messages": text, "max_tokens": 10, **kw}
            return client.post("/v1/chat/completions", json=body)

        replies = [
            ask(temperature=1.0, seed=s).json()["choices"][0]["message"]["content"]
            for s in range(6)
        ]
        assert len(set(replies)) >= 3
        again = ask(temperature=1.0, seed=2).json()["choices"][0]["message"]["content"]
        assert again == replies[2]
        greedy = {ask().json()["choices"][0]["message"]["content"] for _ in range(2)}
        assert len(greedy) == 1
        bad = ask(temperature=-1)
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]


def test_the_candidates_choice_acts_on_the_most_likely_candidate_action(gen):
    from rollouts.ranker.candidate import candidates
    from rollouts.ranker.prompt import parse_prompt

    cands = [c.text for c in candidates(parse_prompt(MESSAGES))]
    assert "click(e3)" in cands and len(cands) >= 3
    policy = HFPolicy(generator=gen, max_new_tokens=12, choose="candidates")
    out = asyncio.run(policy.act(ctx(0)))
    head, _, action = out.text.rpartition("Action: ")
    assert action in cands  # never a malformed action, nor a ref the page lacks
    assert format_action(out.action) == action
    # the generated thought, ended by each candidate: the policy took the most likely reply
    scores = gen.score_replies(MESSAGES, [f"{head}Action: {c}" for c in cands])
    assert action == cands[scores.index(max(scores))]
    assert out.logprob == pytest.approx(max(scores), abs=1e-5)
    # sampled from the candidates' softmax: seeded, reproducible, and not always the argmax
    sampled = HFPolicy(generator=gen, max_new_tokens=12, temperature=50.0, choose="candidates")
    picks = [t.rpartition("Action: ")[2] for t in act_all(sampled, list(range(12)))]
    assert [t.rpartition("Action: ")[2] for t in act_all(sampled, list(range(12)))] == picks
    assert set(picks) <= set(cands) and len(set(picks)) >= 2, picks
    with pytest.raises(ValueError, match="choose is one of generate, candidates"):
        HFPolicy(generator=gen, choose="best")


def test_the_hf_policy_records_its_sampled_token_ids_and_image_token_runs(gen):
    """The ids of a sampled reply (what RL must score, however the text would re-tokenise) and
    where the prompt held its image tokens; a candidates choice (a reply the model scored, not
    sampled) records no ids."""
    out = asyncio.run(HFPolicy(generator=gen, max_new_tokens=12, temperature=1.0).act(ctx(5)))
    tok = gen.processor.tokenizer
    assert out.token_ids and tok.decode(list(out.token_ids)) == out.text
    ids = model_inputs(gen.processor, [MESSAGES])["input_ids"][0].tolist()
    image = image_token_id(gen.processor)
    assert image is not None and ids.count(image) > 0
    assert out.image_spans == tuple(map(tuple, token_runs(ids, image)))
    assert sum(n for _, n in out.image_spans) == ids.count(image)
    assert all(ids[s : s + n] == [image] * n for s, n in out.image_spans)
    chooser = HFPolicy(generator=gen, max_new_tokens=12, choose="candidates")
    picked = asyncio.run(chooser.act(ctx(0)))
    assert picked.token_ids is None


def test_token_runs_and_a_cut_reply_keeps_its_token_ids(tiny):
    from starlette.testclient import TestClient

    from serving.server import build_app

    assert token_runs([5, 1, 1, 2, 1], 1) == [[1, 2], [4, 1]]
    assert token_runs([5, 1], None) == []
    text = [{"role": "user", "content": "Say hi"}]
    with TestClient(build_app(str(tiny), "tiny")) as client:

        def ask(**kw: Any) -> Any:
            body = {"messages": text, "max_tokens": 10, "logprobs": True, **kw}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        full = ask(return_tokens_as_token_ids=True)
        words = full["message"]["content"]
        stop = words[len(words) // 2 : len(words) // 2 + 2]
        assert stop.strip(), words
        cut = ask(return_tokens_as_token_ids=True, stop=[stop])
        named = [t["token"] for t in cut["logprobs"]["content"]]
        assert named and all(t.startswith("token_id:") for t in named)
        assert named == [t["token"] for t in full["logprobs"]["content"]][: len(named)]
