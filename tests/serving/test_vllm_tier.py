"""The vllm tier: real vLLM (``.venv-vllm``) in the loop, with the tiny Idefics3 preset.

- collect: the ``openai`` policy against vLLM in real Chromium; every step stores a log-prob,
  and vLLM's token log-probs equal the hf engine's for the same prompt (screenshots included);
- judge: the rubric VLM judge served by vLLM;
- RL: one iteration (sample a group from vLLM, PPO-clip update of the checkpoint, weight sync:
  vLLM 0.32's in-place reload of the new checkpoint, a restart where that fails): the served
  outputs change and match the new weights; the sync time is printed, with the time a restart
  takes (the server's start-up).

Tolerance of the log-prob comparison: both engines run float32 on the same weights; they differ
only in kernels (vLLM's CPU attention and fused ops vs eager transformers), i.e. in summation
order: float32 rounding, ~1e-7 relative per op. The largest per-token difference measured here
was 4.8e-7 (the tests print theirs). We allow 1e-4: two hundred times that, for other CPUs'
kernels (AVX2 vs AVX-512 blockings), yet far below what a wrong image, a wrong chat template or
another checkpoint gives (the tiny model's log-probs of different tokens differ by ~1e-2, and
one training step moves them by more)."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from PIL import Image

from rollouts.chat import image_part
from rollouts.policies import OpenAIPolicy, PolicyContext
from rollouts.prompts import DATA_URL, PromptConfig, render
from tests.rollouts.test_engine import run_engine, tasks_of
from tests.serving.vllm_tier import VLLM

pytestmark = [*VLLM, pytest.mark.browser]
NAME = "tiny-idefics"
TOL = 1e-4
PROMPT = PromptConfig(max_a11y_chars=3000)


class Recording:
    """A policy wrapper that keeps the messages and outputs of every call."""

    name = "openai"

    def __init__(self, inner: OpenAIPolicy) -> None:
        self.inner, self.calls = inner, []

    async def act(self, ctx: PolicyContext) -> Any:
        out = await self.inner.act(ctx)
        self.calls.append((out.messages, out))
        return out


def chat(server, messages, **kw):
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    return c.chat.completions.create(model=NAME, messages=messages, **kw)


def token_logprobs(server, messages, n: int = 8) -> list[tuple[str, float]]:
    out = chat(server, messages, temperature=0, max_tokens=n, logprobs=True)
    return [(t.token, t.logprob) for t in out.choices[0].logprobs.content]


def same_token(a: str, b: str) -> bool:
    """Token texts as both engines print them: a token that holds part of a multi-byte
    character is "" in one and "\ufffd…" in the other; any other token text must be equal."""
    return a == b or not a or not b or "\ufffd" in a or "\ufffd" in b


def common_prefix(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> int:
    """How many leading tokens the two replies share (log-probs are compared separately)."""
    k = 0
    while k < min(len(a), len(b)) and same_token(a[k][0], b[k][0]):
        k += 1
    return k


def test_collect_with_the_openai_policy_on_vllm_logprobs_match_the_hf_engine(
    vllm_server, hf_server, server, chromium
):
    policy = Recording(
        OpenAIPolicy(
            vllm_server.base_url, NAME, max_tokens=8, timeout_s=300, retries=1, prompt=PROMPT
        )
    )
    tasks = tasks_of("wiki_on_page", 2)
    done, stats, _ = run_engine(
        server, tasks, policy, chromium=chromium, max_steps=2, max_invalid=2
    )
    assert stats.finished == 2 and set(stats.by_status) <= {"success", "failure"}
    steps = [s for d in done.values() for s in d.steps]
    assert len(steps) >= 2
    for s in steps:  # the log-prob of every step is stored with it
        assert s.logprob is not None and s.logprob < 0 and s.prompt_hash
    # the same prompts (screenshots + accessibility tree) to both engines, token by token
    worst = 0.0
    for messages, out in policy.calls[:2]:
        assert "image_url" in render(messages)  # screenshots are part of what is compared
        v = token_logprobs(vllm_server, messages)
        h = token_logprobs(hf_server, messages)
        k = common_prefix(v, h)
        assert k >= 3, (v, h)  # greedy replies agree (near-ties may part them later)
        text_v = chat(vllm_server, messages, temperature=0, max_tokens=8).choices[0]
        text_h = chat(hf_server, messages, temperature=0, max_tokens=8).choices[0]
        if k == len(v) == len(h):  # the same tokens: the same reply text
            assert text_v.message.content == text_h.message.content
        for (_, a), (_, b) in zip(v[:k], h[:k], strict=True):
            worst = max(worst, abs(a - b))
        assert sum(lp for _, lp in v) == pytest.approx(out.logprob, abs=1e-3)
    print(f"largest per-token log-prob difference vLLM vs hf: {worst:.2e}")
    assert worst < TOL


def test_rubric_judge_served_by_vllm(wh, vllm_server):
    from judging.base import make_judge
    from tests.judging.conftest import store_trajectory
    from tests.judging.test_rubric_vlm import run

    store_trajectory(wh, "x", n_steps=2)
    judge = make_judge(
        "rubric_vlm",
        base_url=vllm_server.base_url,
        model=NAME,
        selection="heuristic",
        max_tokens=24,
    )
    summary = run(wh, judge, attempts=1)
    row = wh.sql("SELECT verdict, error, attempts, model FROM judgments").row(0, named=True)
    # vLLM answered (no transport error); a random tiny model cannot write a key-point list
    assert summary.errors == 1 and row["verdict"] is None and row["attempts"] == 1
    assert "key points reply" in row["error"] and row["model"] == NAME


def test_one_rl_iteration_with_weight_sync_changes_what_vllm_serves(
    vllm_server, idefics: Path, tmp_path
):
    import torch

    from tests.serving.test_protocol import WITH_IMAGE
    from training.interface import Turn
    from training.vlm import VLMTrainable

    # 1. a group of 4 samples from the served policy
    group = chat(vllm_server, WITH_IMAGE, n=4, temperature=1.0, seed=1, max_tokens=6)
    replies = [c.message.content for c in group.choices]
    before = token_logprobs(vllm_server, WITH_IMAGE, n=6)
    # 2. rewards: the first sample wins; group-relative advantages (GRPO)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = (rewards - rewards.mean()) / rewards.std()
    png = base64.b64decode(WITH_IMAGE[0]["content"][0]["image_url"]["url"][len(DATA_URL) :])
    turns = [
        Turn(render(WITH_IMAGE), r, (png,), advantage=float(a))
        for r, a in zip(replies, adv, strict=True)
    ]
    torch.manual_seed(0)
    pol = VLMTrainable.load(idefics).train()
    with torch.no_grad():
        old = pol.logprobs(turns).logprob
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-2)
    for _ in range(6):  # PPO-clip epochs over the group
        lp = pol.logprobs(turns).logprob
        ratio = torch.exp(lp - old)
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        new = pol.logprobs(turns).logprob
    assert new[0] > old[0]  # the winner became more likely
    ckpt = tmp_path / "ckpt-1"
    pol.save(ckpt)
    # 3. weight sync: vLLM now serves the new checkpoint (same name, same port)
    original = vllm_server.spec.model
    try:
        t0 = time.monotonic()
        how, took = vllm_server.sync_weights(str(ckpt), timeout_s=900)
        print(
            f"weight sync by {how}: {took:.2f} s "
            f"(a restart: {vllm_server.started_s:.1f} s until healthy)"
        )
        assert time.monotonic() - t0 >= took > 0 and how == "reload"
        after = token_logprobs(vllm_server, WITH_IMAGE, n=6)
        assert after != before  # the served outputs changed
        from rollouts.hf import HFGenerator, load_model

        model, proc = load_model(ckpt)
        [ref] = HFGenerator(model, proc).run_batch([WITH_IMAGE], 6)
        k = common_prefix(after, ref.token_logprobs)
        assert k >= 3, (after, ref.token_logprobs)  # and they are the new weights' outputs
        pairs = zip(after[:k], ref.token_logprobs[:k], strict=True)
        diff = max(abs(a[1] - b[1]) for a, b in pairs)
        print(f"after the sync, largest log-prob difference vLLM vs the checkpoint: {diff:.2e}")
        assert diff < TOL
    finally:
        vllm_server.sync_weights(original, timeout_s=900)


def test_the_rl_stage_rolls_out_on_vllm_syncs_in_place_and_checks_parity(
    vllm_server, server, chromium, wh
):
    """``webloop train rl`` of a VLM on the session's vLLM (the served checkpoint): one GRPO
    iteration rewarded by a rubric judge stand-in (verdicts alternating per task), the update
    synced into vLLM in place, and the server's log-probs equal to the trainer's for the same
    tokens (float32 both: within the tier's tolerance)."""
    from sites.tasks import generate
    from stages.config import config_from_mapping
    from stages.served import ServedCheckpoints
    from stages.train import RLConfig, run_rl
    from tests.rollouts.stand_ins import stand_in
    from warehouse.tasks import put_tasks

    put_tasks(wh, generate(12, 0, templates=["wiki_fact", "mail_archive"]))
    original = vllm_server.spec.model
    served = ServedCheckpoints(engine="vllm", parity_tol=TOL)
    served.server = vllm_server  # the session's server: left running, its weights put back
    try:
        with stand_in() as judge:
            cfg = config_from_mapping(
                RLConfig,
                {
                    "policy": original,
                    "iterations": 1,
                    "serve": "vllm",
                    "lr": 0.05,
                    "batch_size": 8,
                    "ppo_epochs": 1,
                    "rollout": {"n_tasks": 1, "samples": 2, "max_steps": 2},
                    "judge": {"judge": "rubric_vlm", "base_url": judge.url, "model": "j"},
                },
            )
            out = chromium.run(
                run_rl(wh, cfg, server=server, browser=chromium.browser, served=served),
                timeout=1200,
            )
        [it] = out.iterations
        assert it.served_from == original and it.steps_run > 0
        assert it.timing["sync_in_place"] == 1.0 and it.timing["parity_tokens"] > 0
        assert it.timing["parity_max_abs_diff"] < TOL
        assert vllm_server.spec.model == out.checkpoint  # vLLM serves the update
        print(f"RL on vLLM: {it.timing}")
    finally:
        vllm_server.sync_weights(original, timeout_s=900)


def test_vllm_serves_smol_idefics_with_the_in_process_greedy_replies(tmp_path):
    """The pretrained preset (SmolLM2-135M-Instruct as an Idefics3's text model, 64-wide heads)
    served by vLLM: its greedy replies, with and without a screenshot, are the in-process
    model's token for token, and the pretrained language survived (it answers a fact)."""
    from rollouts.hf import HFGenerator, load_model
    from serving.supervisor import ModelServer, ServerSpec, free_port
    from tests.serving import vllm_tier
    from training.models import build_smol_idefics

    if vllm_tier.early is not None:  # the session's tiny model is being built in a thread:
        vllm_tier.early.wait()  # transformers' lazy imports are not safe from two threads
    model_dir = build_smol_idefics(tmp_path / "smol-idefics")
    buf = io.BytesIO()
    Image.new("RGB", (160, 100), (200, 30, 30)).save(buf, format="PNG")
    shot = image_part(buf.getvalue())
    prompts = [
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        [
            {"role": "system", "content": "You are a web agent."},
            {"role": "user", "content": [shot, {"type": "text", "text": "What do you see?"}]},
        ],
    ]
    local = [g.text for g in HFGenerator(*load_model(model_dir)).run_batch(prompts, 16)]
    spec = ServerSpec(
        "vllm",
        str(model_dir),
        port=free_port(),
        name="smol-idefics",
        enforce_eager=True,
        max_model_len=2048,
    )
    with ModelServer(spec, log=tmp_path / "vllm.log").start() as srv:
        c = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=300)
        served = [
            c.chat.completions.create(
                model="smol-idefics", messages=m, temperature=0, max_tokens=16
            )
            .choices[0]
            .message.content
            for m in prompts
        ]
    print("in-process:", local, "served:", served)
    assert served == local
    assert "Paris" in served[0]
