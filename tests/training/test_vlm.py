"""The VLM model path (training/vlm.py) on the tiny offline Qwen2-VL and a REAL exported dataset:
SFT lowers the loss, prompts tokenise exactly as at rollout, RL updates move log-probs by the sign
of the advantage, λ weights the thought, checkpoints round-trip, bad data is refused."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from curation.examples import sft_messages
from rollouts.hf import HFGenerator, Sampling, load_model, model_inputs
from rollouts.prompts import render
from tests.training.conftest import turn_of
from training.interface import DataMismatch, Turn
from training.vlm import VLMTrainable, reply_weights

ROOT = Path(__file__).resolve().parents[2]


def fresh(tiny: Path, **kw: Any) -> VLMTrainable:
    torch.manual_seed(0)
    return VLMTrainable.load(tiny, **kw)


def test_exported_rows_are_image_prompts_the_model_accepts(rows, turns, tiny):
    assert len(rows) >= 20 and all(t.images for t in turns)
    assert any("Thought:" in t.completion for t in turns)
    assert all(render(sft_messages(r)[:-1]) == r["prompt"] for r in rows)
    fresh(tiny).check_data(turns)  # no error


def test_sft_lowers_the_loss_on_an_exported_dataset(turns, tiny):
    pol = fresh(tiny).train()
    opt = torch.optim.AdamW(pol.parameters(), lr=3e-3)
    batch = turns[:4]

    def loss() -> torch.Tensor:
        out = pol.logprobs(batch)
        assert bool(out.covered.all())
        return (-out.logprob / out.n_tokens).mean()

    losses = []
    for _ in range(20):
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    assert losses[-1] < 0.5 * losses[0], losses
    with torch.no_grad():
        assert loss().item() < losses[0]


def test_training_prompt_tokens_are_the_rollout_tokens(rows, tiny):
    pol = fresh(tiny)
    for row in rows[:6]:
        messages = sft_messages(row)[:-1]  # what the policy was given at rollout
        rollout = model_inputs(pol.processor, [messages])
        enc = pol.encode(turn_of(row))
        assert enc.prompt_ids == rollout["input_ids"][0].tolist()
        assert torch.equal(enc.media["pixel_values"], rollout["pixel_values"])
        assert torch.equal(enc.media["image_grid_thw"], rollout["image_grid_thw"])
        tok = pol.tokenizer
        assert tok.decode(enc.prompt_ids[-8:]).endswith("<|im_start|>assistant\n")
        reply = tok(row["completion"], add_special_tokens=False)["input_ids"]
        assert enc.reply_ids == [*reply, tok.convert_tokens_to_ids("<|im_end|>")]


def test_batched_logprobs_equal_one_by_one(turns, tiny):
    pol = fresh(tiny).train(False)
    batch = [turns[0], turns[5], turns[11]]  # different lengths: left padding in the batch
    with torch.no_grad():
        together = pol.logprobs(batch).logprob
        alone = torch.cat([pol.logprobs([t]).logprob for t in batch])
    assert torch.allclose(together, alone, atol=1e-4), (together, alone)


def test_rl_update_follows_the_sign_of_the_advantage(turns, tiny):
    pol = fresh(tiny).train()
    good = Turn(turns[0].prompt, "Action: click(e1)", turns[0].images, advantage=1.0)
    bad = Turn(turns[0].prompt, 'Action: answer("wrong")', turns[0].images, advantage=-1.0)
    batch = [good, bad]
    with torch.no_grad():
        before = pol.logprobs(batch).logprob
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-3)
    out = pol.logprobs(batch)
    adv = torch.tensor([t.advantage for t in batch])
    ratio = torch.exp(out.logprob - before)  # PPO-clip, old = before the update
    loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = pol.logprobs(batch).logprob
    assert after[0] > before[0] and after[1] < before[1], (before, after)


def reference_token_logprobs(pol: VLMTrainable, turn: Turn) -> torch.Tensor:
    """Log-probs of the reply tokens by a plain full-logits forward (independent of logprobs)."""
    enc = pol.encode(turn)
    ids = torch.tensor([enc.prompt_ids + enc.reply_ids])
    extra = {
        "mm_token_type_ids": torch.tensor(
            [enc.token_extras["mm_token_type_ids"] + [0] * len(enc.reply_ids)]
        )
    }
    with torch.no_grad():
        logits = pol.module(
            input_ids=ids, attention_mask=torch.ones_like(ids), **enc.media, **extra
        ).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    n = len(enc.prompt_ids)
    return torch.stack([lp[n - 1 + k, t] for k, t in enumerate(enc.reply_ids)])


def test_reasoning_weight_scales_only_the_thought_tokens(turns, tiny):
    turn = next(t for t in turns if t.completion.startswith("Thought:"))
    thought, _ = turn.completion.rsplit("\nAction:", 1)
    pol1 = fresh(tiny).train(False)
    token_lp = reference_token_logprobs(pol1, turn)
    tok = pol1.tokenizer
    enc = tok(turn.completion, add_special_tokens=False, return_offsets_mapping=True)
    n_thought = sum(1 for _, end in enc["offset_mapping"] if end <= len(thought) + 1)
    assert 0 < n_thought < len(token_lp) - 1
    results = {}
    for lam in (0.0, 0.5, 1.0):
        pol = VLMTrainable(pol1.module, pol1.processor, reasoning_weight=lam)
        with torch.no_grad():
            out = pol.logprobs([turn])
        results[lam] = (out.logprob.item(), out.n_tokens.item())
    thought_sum, action_sum = token_lp[:n_thought].sum().item(), token_lp[n_thought:].sum().item()
    assert results[0.0][0] == pytest.approx(action_sum, abs=1e-3)  # thought contributes nothing
    assert results[0.0][1] == len(token_lp) - n_thought
    assert results[1.0][0] == pytest.approx(thought_sum + action_sum, abs=1e-3)
    assert results[0.5][0] == pytest.approx(0.5 * thought_sum + action_sum, abs=1e-3)
    assert results[0.5][1] == 0.5 * n_thought + len(token_lp) - n_thought


def test_reply_weights_split_at_the_last_action_line():
    text = "Thought: Action: is not a line start\nAction: click(e1)"
    offsets = [(0, 8), (8, 36), (36, 37), (37, 44), (44, 54)]
    assert reply_weights(text, offsets, 0.25) == [0.25, 0.25, 0.25, 1.0, 1.0]
    assert reply_weights("click(e1)", [(0, 5), (5, 9)], 0.0) == [1.0, 1.0]  # no Action line


def step_save_and_reload(pol: VLMTrainable, turns: list[Turn], start: Path, ckpt: Path) -> None:
    """One optimiser step of ``pol`` on ``turns``, saved to ``ckpt``: the reloaded checkpoint
    gives the trained log-probs (LoRA: merged), not the ``start`` model's."""
    opt = torch.optim.AdamW(list(pol.parameters()), lr=1e-2)
    (-pol.logprobs(turns).logprob.sum()).backward()
    opt.step()  # LoRA B starts at zero: one step makes the adapter matter
    pol.train(False)
    pol.save(ckpt)
    back = VLMTrainable.load(ckpt).train(False)
    with torch.no_grad():
        a, b = pol.logprobs(turns).logprob, back.logprobs(turns).logprob
        base = fresh(start).train(False).logprobs(turns).logprob
    assert torch.allclose(a, b, atol=1e-4), (a, b)
    assert not torch.allclose(a, base, atol=1e-3)  # the update is in the checkpoint


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8}])
def test_save_then_load_gives_identical_logprobs_and_greedy_outputs(turns, tiny, tmp_path, lora):
    pol = fresh(tiny, lora=lora).train()
    trainable = list(pol.parameters())
    if lora:
        assert trainable and all(
            "lora_" in n for n, p in pol.module.named_parameters() if p.requires_grad
        )
    step_save_and_reload(pol, turns[:4], tiny, tmp_path / "ckpt")
    messages = [_messages(t) for t in turns[:3]]
    model, proc = load_model(tmp_path / "ckpt")  # as the hf policy loads it
    live = HFGenerator(pol.module, pol.processor).run_batch(messages, 8)
    loaded = HFGenerator(model, proc).run_batch(messages, 8)
    assert [g.text for g in live] == [g.text for g in loaded]


def _messages(turn: Turn) -> list[dict[str, Any]]:
    from training.vlm import turn_messages

    return turn_messages(turn)


def test_check_data_refuses_what_cannot_train(turns, tiny):
    pol = fresh(tiny)
    t = turns[0]
    with pytest.raises(DataMismatch, match="no turns"):
        pol.check_data([])
    with pytest.raises(DataMismatch, match=r"references 1 image\(s\) but the turn carries 0"):
        pol.check_data([Turn(t.prompt, t.completion, (), key="t01/0")])
    two = next(x for x in turns if len(x.images) == 2)
    with pytest.raises(DataMismatch, match="does not match its reference"):
        pol.check_data([Turn(two.prompt, two.completion, two.images[::-1])])
    with pytest.raises(DataMismatch, match=r"not rollouts\.prompts\.render JSON"):
        pol.check_data([Turn("Task: click it", "Action: click(e1)")])
    with pytest.raises(DataMismatch, match="not a sha256: reference"):
        pol.check_data([Turn(sft_messages_json(t), t.completion, t.images)])
    text_only = VLMTrainable(pol.module, pol.tokenizer)  # no image processor: no vision input
    with pytest.raises(DataMismatch, match="no vision tower"):
        text_only.check_data([t])


def sft_messages_json(turn: Turn) -> str:
    import json

    return json.dumps(_messages(turn))


@pytest.mark.slow  # a fresh interpreter
def test_gpu_check_skips_cleanly_without_cuda():
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "skipped: no CUDA device" in proc.stdout


@pytest.mark.gpu
def test_gpu_check_trains_a_qwen_vl_shaped_model_on_cuda():
    """On a CUDA machine (``pytest -m gpu``): the GPU check's SFT and PPO-clip steps run on the
    device and report their throughput."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--size", "tiny", "--steps", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert ", cuda (" in proc.stdout and "skipped" not in proc.stdout
    for phase in ("sft:", "rl-ppo-clip:"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(phase))
        assert float(line.split(" examples/s")[0].rsplit(" ", 1)[-1]) > 0


def test_gpu_check_carries_its_tokenizer_text_and_profiles_a_step(tmp_path, capsys):
    """The text dumped for a machine without the sites is what the check trains its tokenizer
    on there, and ``--profile`` prints the ops of one step (tiny size, on the CPU)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    saved = tmp_path / "corpus.json"
    assert gpu_check.main(["--dump-corpus", str(saved)]) == 0
    assert gpu_check.corpus(saved) == gpu_check.corpus()
    argv = ["--size", "tiny", "--cpu", "--steps", "1", "--batch", "1", "--corpus", str(saved)]
    assert gpu_check.main([*argv, "--profile", "4"]) == 0
    out = capsys.readouterr().out
    assert "Self CPU time total" in out and "aten::" in out


def test_cuda_only_options_are_ignored_with_a_warning_on_the_cpu(tiny):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.warns(UserWarning, match="bf16 applies on CUDA only"):
        pol = VLMTrainable.load(tiny, bf16=True)
    assert next(pol.module.parameters()).dtype == torch.float32
    with pytest.warns(UserWarning, match="gradient_checkpointing applies on CUDA only"):
        pol = VLMTrainable.load(tiny, gradient_checkpointing=True)
    assert not pol.module.is_gradient_checkpointing
    with pytest.raises(ValueError, match="reasoning_weight"):
        VLMTrainable.load(tiny, reasoning_weight=-1.0)


# -- the tiny Idefics3 (SmolVLM-shaped) preset: the VLM path's Idefics3 way ------------------------


@pytest.fixture(scope="module")
def idefics(tmp_path_factory) -> Path:
    from training.models import build_tiny_idefics

    return build_tiny_idefics(tmp_path_factory.mktemp("idefics") / "tiny-idefics")


def test_idefics_batches_turns_with_different_image_counts_like_one_by_one(turns, idefics):
    pol = fresh(idefics).train(False)
    pol.check_data(turns)
    by_count = {len(t.images): t for t in turns if t.images}
    assert len(by_count) >= 2, "the dataset should hold turns with different image counts"
    batch = [*by_count.values()][:3]
    shapes = [pol.prompt_inputs(t)["pixel_values"].shape for t in batch]
    assert len({s[1] for s in shapes}) >= 2  # rows of different image-tile counts
    with torch.no_grad():
        together = pol.logprobs(batch).logprob
        alone = torch.cat([pol.logprobs([t]).logprob for t in batch])
    assert torch.allclose(together, alone, atol=1e-4), (together, alone)


def test_lora_on_idefics_adapts_its_text_models_projections_and_saves_merged(
    turns, idefics, tmp_path
):
    """The presets are Idefics3s, whose language model is ``text_model``: LoRA adapts its seven
    projections in every layer (not the vision tower's), and the saved checkpoint is merged."""
    pol = fresh(idefics, lora={"r": 4, "lora_alpha": 8}).train()
    names = [n for n, p in pol.module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n and ".text_model." in n for n in names)
    kinds = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    step_save_and_reload(pol, turns[:2], idefics, tmp_path / "ckpt")


def test_idefics_sft_lowers_the_loss_and_its_checkpoint_serves_with_rollout_tokens(
    turns, idefics, tmp_path
):
    pol = fresh(idefics).train()
    batch = [t for t in turns if t.images][:4]
    opt = torch.optim.AdamW(pol.parameters(), lr=3e-3)

    def loss() -> torch.Tensor:
        out = pol.logprobs(batch)
        return -(out.logprob / out.n_tokens).mean()

    first = float(loss().detach())
    before = [p.detach().clone() for p in pol.parameters()]
    for _ in range(8):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert float(loss().detach()) < first - 0.5
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.parameters(), strict=True))
    # the saved checkpoint generates (hf engine) what it learnt: the trained reply's tokens
    pol.save(tmp_path / "ckpt")
    model, proc = load_model(tmp_path / "ckpt")
    gen = HFGenerator(model, proc)
    msgs = _messages(batch[0])
    inputs = model_inputs(proc, [msgs])
    enc = pol.encode(batch[0])
    assert inputs["input_ids"][0].tolist()[-len(enc.prompt_ids) :] == enc.prompt_ids
    [out] = gen.run_batch([msgs], 12)
    assert out.token_logprobs and out.completion_tokens > 0


def test_encodings_are_cached_by_prompt_and_completion_within_a_memory_bound(turns, tiny):
    import dataclasses

    import training.vlm as vlm

    pol = fresh(tiny)
    first = pol.encode(turns[0])
    assert pol.encode(turns[0]) is first  # an epoch's second pass: no processor work
    other = pol.encode(dataclasses.replace(turns[0], completion="Action: scroll(down)"))
    assert other is not first and other.reply_ids != first.reply_ids
    assert pol.encode(dataclasses.replace(turns[0], key="elsewhere")) is first  # same content
    bound = vlm.ENCODE_CACHE_BYTES
    try:
        vlm.ENCODE_CACHE_BYTES = 1  # over the bound: only the latest stays
        pol.encode(turns[1])
        assert len(pol._encoded) == 1 and pol.encode(turns[1]) is not first
        assert pol.encode(turns[0]) is not first  # evicted: encoded again, equal
        assert pol.encode(turns[0]).prompt_ids == first.prompt_ids
    finally:
        vlm.ENCODE_CACHE_BYTES = bound


@pytest.mark.parametrize("arch", ["qwen2-vl", "idefics3"])
def test_scored_replies_are_the_trainers_log_probs(arch, rows, tiny, tmp_path):
    """``HFGenerator.score_replies`` (the hf policy's candidates choice) against the trainer's
    own reply log-probs of the same turns (end-of-turn token included in both): on Qwen2-VL one
    whole pass per reply, on Idefics3 (the VLM bench's architecture) the prompt and its image
    once, its key/value cache serving every reply; two chunks, the second padded."""
    from training.models import build_tiny_idefics

    torch.manual_seed(0)
    path = tiny if arch == "qwen2-vl" else build_tiny_idefics(tmp_path / "idefics")
    pol = VLMTrainable.load(path).train(False)
    row = rows[3]
    replies = [row["completion"], "Thought: go.\nAction: click(e1)", 'Action: answer("no")']
    gen = HFGenerator(pol.module, pol.processor)
    scores = gen.score_replies(sft_messages(row)[:-1], replies, chunk=2)
    with torch.no_grad():
        turns = [dataclasses.replace(turn_of(row), completion=r) for r in replies]
        want = pol.logprobs(turns).logprob.tolist()
    assert scores == pytest.approx(want, abs=1e-4)
    assert len(set(scores)) == 3


def test_sampled_reply_ids_train_as_sampled_not_as_retokenised(rows, tiny):
    """A turn carrying the engine's sampled ids trains on exactly those tokens: the ids the
    generator chose (and their log-probs), a spelling of the text other than the tokenizer's
    own, a trailing end-of-turn id dropped once; ids outside the vocabulary and image tokens
    placed differently from the trainer's prompt are refused."""
    pol = fresh(tiny).train(False)
    tok, row = pol.tokenizer, rows[2]
    gen = HFGenerator(pol.module, pol.processor)
    [g] = gen.run_batch([sft_messages(row)[:-1]], 10, sampling=[Sampling(1.0, 1.0, 3)])
    assert g.token_ids and g.image_spans and tok.decode(g.token_ids) == g.text
    base = dataclasses.replace(turn_of(row), completion=g.text)
    turn = dataclasses.replace(
        base, reply_ids=tuple(g.token_ids), image_spans=tuple(map(tuple, g.image_spans))
    )
    enc = pol.encode(turn)
    assert enc.reply_ids == [*g.token_ids, pol.end_id]
    with torch.no_grad():
        total = pol.logprobs([turn]).logprob.item()
    end = pol.token_logprobs(turn, enc.reply_ids)[-1]
    assert total - end == pytest.approx(sum(lp for _, lp in g.token_logprobs), abs=1e-3)
    # the same text in other tokens (one token a character): trained as spelled
    text = "Action: click(e12)"
    own = tok(text, add_special_tokens=False)["input_ids"]
    spelled = [i for c in text for i in tok(c, add_special_tokens=False)["input_ids"]]
    assert spelled != own and tok.decode(spelled) == text
    as_text = dataclasses.replace(base, completion=text)
    as_spelled = dataclasses.replace(as_text, reply_ids=(*spelled, pol.end_id))
    assert pol.encode(as_text).reply_ids == [*own, pol.end_id]
    assert pol.encode(as_spelled).reply_ids == [*spelled, pol.end_id]
    with torch.no_grad():
        two = pol.logprobs([as_text, as_spelled])
    assert two.n_tokens.tolist() == [len(own) + 1, len(spelled) + 1]
    assert two.logprob[0].item() != pytest.approx(two.logprob[1].item(), abs=1e-3)
    # λ weights the thought of sampled ids as it weights the text's tokens
    half = VLMTrainable(pol.module, pol.processor, reasoning_weight=0.5)
    thought = turn_of(next(r for r in rows if r["completion"].startswith("Thought:")))
    ids = tuple(tok(thought.completion, add_special_tokens=False)["input_ids"])
    assert half.counts([dataclasses.replace(thought, reply_ids=ids)]) == half.counts([thought])
    # a reply that sampled the image placeholder cannot be fed back as text: its text's tokens
    image = pol.processor.image_token_id
    assert image in pol.media_ids
    odd = dataclasses.replace(as_text, reply_ids=(image, *spelled))
    assert pol.encode(odd).reply_ids == [*own, pol.end_id]
    vocab = pol.module.get_input_embeddings().weight.shape[0]
    with pytest.raises(DataMismatch, match=f"sampled token id {vocab} is outside"):
        pol.encode(dataclasses.replace(turn, reply_ids=(1, vocab)))
    with pytest.raises(DataMismatch, match=r"held image tokens at \[\(0, 2\)\]"):
        pol.encode(dataclasses.replace(turn, image_spans=((0, 2),)))
