"""Real model code paths with a tiny offline VLM: in-process (hf) and over HTTP (serve-model)."""

from __future__ import annotations

import re

import httpx
import pytest

from rollouts.hf import HFGenerator, HFPolicy, load_model
from rollouts.policies import OpenAIPolicy
from tests.rollouts.test_engine import run_engine, tasks_of

pytestmark = pytest.mark.browser


def test_serve_model_speaks_the_openai_protocol(served: str):
    models = httpx.get(served + "/models").json()
    assert models["data"][0]["id"] == "tiny"
    r = httpx.post(
        served + "/chat/completions",
        json={
            "model": "tiny",
            "max_tokens": 8,
            "logprobs": True,
            "messages": [{"role": "user", "content": "Say hi"}],
        },
        timeout=60,
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert isinstance(choice["message"]["content"], str)
    assert len(choice["logprobs"]["content"]) == body["usage"]["completion_tokens"]
    assert all(t["logprob"] <= 0 for t in choice["logprobs"]["content"])
    bad = httpx.post(served + "/chat/completions", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and "non-empty" in bad.json()["error"]["message"]


def test_openai_policy_over_http_with_the_tiny_model_completes_trajectories(server, served):
    tasks = tasks_of("wiki_on_page", 2)
    policy = OpenAIPolicy(served, "tiny", max_tokens=16, timeout_s=60, retries=1)
    done, stats, _ = run_engine(server, tasks, policy, max_steps=3, max_invalid=2)
    assert stats.finished == 2 and set(stats.by_status) <= {"success", "failure"}
    for d in done.values():
        assert 1 <= d.trajectory.n_steps <= 3
        for s in d.steps:
            assert s.prompt_hash and s.model_output is not None
            assert s.logprob is not None and s.logprob <= 0
            prompt = d.blobs[s.prompt_hash].decode()
            refs = re.findall(r'"url":"sha256:([0-9a-f]{64})"', prompt)
            assert refs and all(r in d.blobs for r in refs)  # images stored once, by hash


def test_hf_policy_batches_concurrent_trajectories(server, tiny):
    model, proc = load_model(tiny)
    gen = HFGenerator(model, proc, max_batch=8, wait_s=0.05)
    tasks = tasks_of("wiki_on_page", 3, seed=4)
    done, stats, _ = run_engine(
        server,
        tasks,
        HFPolicy(generator=gen, max_new_tokens=8),
        concurrency=3,
        max_steps=2,
        max_invalid=2,
    )
    assert stats.finished == 3
    total_steps = sum(d.trajectory.n_steps for d in done.values())
    assert gen.batches < total_steps  # some steps of different trajectories shared a batch
