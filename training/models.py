"""Model factory: tiny vision-language models built offline, for tests and CPU runs.

No weights can be downloaded here, so real model code paths are exercised with a tiny random
Qwen2-VL (hidden 64, two layers, a small vision tower; 32-wide attention heads) and a byte-level
BPE tokenizer trained on webloop's own prompt and action text. ``build_tiny_vlm(out)`` writes a
folder that ``rollouts.hf.load_model`` (and ``webloop serve-model``) loads like any checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from rollouts.hf import image_only_processor_class
from rollouts.prompts import SYSTEM_PROMPT

SPECIAL_TOKENS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|endoftext|>",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% else %}{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}"
    "{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    SYSTEM_PROMPT,
    'Thought: the search box is at the top of the page. Action: type(e12, "wireless mouse")',
    "Thought: I should open the first result. Action: click(412, 96)",
    'Thought: the answer is on the page. Action: answer("1,234,567")',
    'Action: click(css="#add-to-cart")',
    "Action: scroll(down)",
    'Action: press("Enter")',
    "Task: Previous actions: none Current page: Accessibility tree <page> </page>",
    '- button "Search" [ref=e3] [cursor=pointer] - link - textbox - heading - generic',
]


def build_tokenizer(vocab_size: int = 1024):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _CORPUS * 20, vocab_size=vocab_size, new_special_tokens=SPECIAL_TOKENS
    )
    tok.pad_token, tok.eos_token = "<|endoftext|>", "<|im_end|>"
    return tok


def build_tiny_vlm(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random Qwen2-VL checkpoint (model + processor) to ``out_dir``."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    tok = build_tokenizer()
    image_proc = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    proc = image_only_processor_class()(
        image_processor=image_proc, tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    cfg = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 8192,
            "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "in_channels": 3,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    return out
