"""The openai policy against a real local OpenAI-protocol server: retries, invalid steps, errors."""

from __future__ import annotations

import pytest

from rollouts.policies import OpenAIPolicy
from tests.rollouts.fake_openai import FakeOpenAI, last_user_text
from tests.rollouts.test_engine import run_engine, tasks_of

pytestmark = pytest.mark.browser


def policy(url: str, **kw) -> OpenAIPolicy:
    return OpenAIPolicy(url, "test-model", timeout_s=1.0, retries=3, backoff_s=0.01, **kw)


def test_500s_timeouts_and_garbage_are_retried_and_bad_output_is_an_invalid_step(
    server, monkeypatch
):
    monkeypatch.setenv("WEBLOOP_API_KEY", "sk-test-secret")
    task = tasks_of("wiki_on_page", 1)[0]
    truth = task.reference[-1].removeprefix("answer(").removesuffix(")")
    script = [
        ("status", 500),
        ("sleep", 3.0),
        ("garbage", "{not json"),
        ("reply", "Thought: hmm.\nAction: fly(to the moon)"),
        ("reply", f"Thought: the infobox says it.\nAction: answer({truth})"),
    ]
    with FakeOpenAI(script) as fake:
        done, _stats, _ = run_engine(server, [task], policy(fake.url))
    d = next(iter(done.values()))
    assert d.trajectory.status == "success", d.trajectory
    assert [s.action_error is not None for s in d.steps] == [True, False]
    assert "no action found" in d.steps[0].action_error or "unknown" in d.steps[0].action_error
    assert d.steps[1].logprob == pytest.approx(-0.75)
    assert len(fake.requests) == 5
    # the prompt carried the task, the page's tree and a screenshot as a data URL
    body = fake.requests[-1]
    assert task.instruction in last_user_text(body)
    images = [c for c in body["messages"][-1]["content"] if c["type"] == "image_url"]
    assert images and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "(invalid action)" in last_user_text(body)  # the history shows the invalid step
    assert fake.headers[0]["authorization"] == "Bearer sk-test-secret"
    # the key never lands in stored data
    for s in d.steps:
        for digest in (s.prompt_hash, s.a11y_hash):
            assert b"sk-test-secret" not in d.blobs[digest]


def test_a_server_that_keeps_failing_is_an_infra_error_not_a_failure(server):
    tasks = tasks_of("wiki_on_page", 2)
    with FakeOpenAI([], default=("status", 503)) as fake:
        done, stats, _ = run_engine(server, tasks, policy(fake.url))
    assert stats.by_status == {"infra_error": 2}
    d = next(iter(done.values()))
    assert "PolicyUnavailable" in d.trajectory.error and "HTTP 503" in d.trajectory.error
    assert len(fake.requests) == 8  # 4 attempts per trajectory


def test_too_many_invalid_actions_end_the_episode(server):
    task = tasks_of("wiki_on_page", 1)[0]
    with FakeOpenAI([], default=("reply", "I refuse to answer in the format.")) as fake:
        done, _, _ = run_engine(server, [task], policy(fake.url), max_invalid=3)
    d = next(iter(done.values()))
    assert d.trajectory.status == "failure" and len(d.steps) == 3
    assert d.trajectory.meta["ended_by"] == "invalid actions"
    assert len(fake.requests) == 3
