"""serve-model speaks the OpenAI protocol the way the stock ``openai`` client uses it — the same
checks against webloop's hf engine and against vLLM (vllm tier), same tiny Idefics3: ``n``
samples, streaming, ``finish_reason`` ``length``, seeded temperature/top-p sampling, the
completions endpoint, log-probs; and a clear 400 for what the hf engine does not support."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from PIL import Image

from tests.serving.vllm_tier import VLLM

ENGINES = ["hf", pytest.param("vllm", marks=VLLM)]
SAY = [{"role": "user", "content": "Thought: the search box is at the top. Action:"}]


def png_url(color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (80, 50), color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


WITH_IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": png_url((200, 30, 30))}},
            {"type": "text", "text": "Task: click the search box. Action:"},
        ],
    }
]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def chat(server, messages=SAY, **kw):
    return client(server).chat.completions.create(model="tiny-idefics", messages=messages, **kw)


@pytest.mark.parametrize("engine", ENGINES)
def test_n_samples_are_n_choices_seeded_and_reproducible(engine, server_of):
    out = chat(server_of, n=4, temperature=1.0, seed=11, max_tokens=8)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) >= 2, texts  # samples of a near-uniform tiny model differ
    again = chat(server_of, n=4, temperature=1.0, seed=11, max_tokens=8)
    assert [c.message.content for c in again.choices] == texts
    other = chat(server_of, n=4, temperature=1.0, seed=12, max_tokens=8)
    assert [c.message.content for c in other.choices] != texts
    assert 4 <= out.usage.completion_tokens <= 32


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_top_p_and_max_tokens_finish_reason(engine, server_of):
    greedy = chat(server_of, temperature=0, max_tokens=6, logprobs=True)
    choice = greedy.choices[0]
    assert choice.finish_reason == "length"  # 6 tokens cannot reach the end of a random reply
    assert greedy.usage.completion_tokens == 6 == len(choice.logprobs.content)
    assert all(t.logprob <= 0 for t in choice.logprobs.content)
    assert chat(server_of, temperature=0, max_tokens=6).choices[0].message.content == (
        choice.message.content
    )
    # a nucleus so small that only the most likely token is left: sampling is greedy
    nucleus = chat(server_of, temperature=1.0, top_p=1e-6, seed=3, max_tokens=6)
    assert nucleus.choices[0].message.content == choice.message.content


@pytest.mark.parametrize("engine", ENGINES)
def test_streaming_sends_the_reply_in_chunks(engine, server_of):
    whole = chat(server_of, messages=WITH_IMAGE, temperature=0, max_tokens=8)
    stream = chat(
        server_of,
        messages=WITH_IMAGE,
        temperature=0,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    texts = [d for d in deltas if d]
    # serve-model sends a chunk per token; vLLM merges the deltas its engine produced while the
    # HTTP side lagged (RequestOutputCollector: under load one chunk can carry all 8 tokens)
    assert len(texts) >= (2 if engine == "hf" else 1)
    assert "".join(deltas) == whole.choices[0].message.content
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize("engine", ENGINES)
def test_completions_endpoint(engine, server_of):
    c = client(server_of)
    out = c.completions.create(
        model="tiny-idefics",
        prompt=["Action: click(", "Thought:"],
        max_tokens=5,
        n=2,
        temperature=1.0,
        seed=5,
        logprobs=0,
    )
    assert len(out.choices) == 4 and sorted(ch.index for ch in out.choices) == [0, 1, 2, 3]
    for ch in out.choices:
        assert ch.finish_reason == "length"
        assert len(ch.logprobs.token_logprobs) == 5
        assert all(v <= 0 for v in ch.logprobs.token_logprobs)
    greedy = c.completions.create(
        model="tiny-idefics", prompt="Thought:", max_tokens=5, temperature=0
    )
    text = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model="tiny-idefics", prompt="Thought:", max_tokens=5, stream=True, temperature=0
        )
        if ch.choices
    )
    assert text == greedy.choices[0].text and greedy.usage.completion_tokens == 5


def test_hf_engine_refuses_what_it_does_not_support_with_a_400(hf_server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = [
        ({"tools": [tool]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        ({"n": 99}, "'n'"),
        ({"temperature": -1}, "temperature"),
    ]
    for kw, word in cases:
        with pytest.raises(openai.BadRequestError) as err:
            chat(hf_server, max_tokens=4, **kw)
        assert err.value.status_code == 400 and word in str(err.value), (kw, str(err.value))
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client(hf_server).completions.create(model="tiny-idefics", prompt=[[1, 2, 3]])
    with pytest.raises(openai.BadRequestError, match="top alternatives"):
        client(hf_server).completions.create(model="tiny-idefics", prompt="x", logprobs=2)


def test_hf_engine_stop_strings_cut_the_reply(hf_server):
    full = chat(hf_server, temperature=0, max_tokens=12).choices[0].message.content
    assert len(full) >= 6, f"the greedy reply {full!r} is too short to stop inside"
    stop = full[3:5]
    cut = chat(hf_server, temperature=0, max_tokens=12, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]
