"""The VLM model path of the trainer: a Hugging Face vision-language model as a
:class:`~training.interface.TrainablePolicy`.

A :class:`~training.interface.Turn` is turned into model inputs exactly as the ``hf`` rollout
policy does it: the rendered prompt (``sha256:`` image references) is rebuilt into OpenAI chat
messages with the turn's PNG bytes as data URLs, then :func:`rollouts.hf.prompt_text` and
:func:`rollouts.hf.split_messages` (the rollout code itself) give the chat-template text with the
generation prompt and the decoded images, and the processor tokenises them. The reply follows:
the completion's tokens (tokenised alone, no special tokens added) and the template's
end-of-turn token (``<|im_end|>`` for Qwen-VL), which the reply's log-prob includes — a
generation that stops is a generation that emitted it.

A turn that carries the ids the rollout engine sampled (``Turn.reply_ids``, from
``steps.token_ids``) trains on exactly those tokens (a trailing end-of-turn id the engine
reported is dropped, then the template's is appended as above). Turns without them are
tokenised from their text, which can differ from what was sampled (one string, several
spellings in tokens); so are replies that sampled an image or video placeholder token (a model
early in training can), which the model cannot take back as text. A turn's stored image-token
runs (``Turn.image_spans``) must match the trainer's own prompt ids, else
:class:`DataMismatch`: the processor that built the rollout's prompt and the trainer's lay the
prompt out differently.

Log-probs (RL4VLM): ``logprob = λ·Σ log p(thought tokens) + Σ log p(action tokens)``, where the
thought is the part of the reply before its LAST line starting with ``Action:`` (a token that
overlaps that line counts as action) and λ is ``reasoning_weight``; a reply without an
``Action:`` line is all action (weight 1). ``n_tokens = λ·n_thought + n_action``. Prompt tokens
never count. Nothing is truncated: every turn runs at its full length, so ``covered`` is True
unless the tokenizer cannot spell the reply (its unknown token appears; a byte-level BPE such as
Qwen's never does).

The rollout policy's own log-prob (``rollouts.hf`` reports the sampled tokens, without the
end-of-turn token and without λ) is not this number: recompute ``old_logprob`` with
:meth:`VLMTrainable.logprobs` before the first RL update.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.hf import (
    end_of_turn_token,
    image_token_id,
    load_model,
    prompt_text,
    split_messages,
    token_runs,
)
from rollouts.prompts import BLOB_REF, DATA_URL
from training.interface import DataMismatch, Turn, TurnLogprobs

# LoRA on the language model's projections only: Qwen-VL's ``language_model``, Idefics3's (the
# presets') ``text_model``; the vision towers have layers with the same names, which stay frozen.
DEFAULT_LORA_TARGETS = (
    r".*(language_model|text_model).*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
)
ENCODE_CACHE_BYTES = 512 * 2**20  # encoded turns kept (a small model's: ~100 KB with its image)
_ACTION_LINE = re.compile(r"^[ \t]*Action:", re.MULTILINE)


@dataclass
class _Encoded:
    """One turn as model inputs: prompt ids (exactly the rollout's), reply ids and weights."""

    prompt_ids: list[int]
    reply_ids: list[int]
    reply_weights: list[float]
    token_extras: dict[str, list[int]]  # other per-token processor outputs (mm_token_type_ids)
    media: dict[str, Any]  # per-image tensors (pixel_values, image_grid_thw), dim 0 = images
    covered: bool


def turn_messages(turn: Turn) -> list[dict[str, Any]]:
    """The OpenAI chat messages of a turn's prompt, images as PNG data URLs (what the rollout
    policy was given). Raises :class:`DataMismatch` for a prompt that is not a rendered webloop
    prompt or whose images do not match its references."""
    where = f"turn {turn.key!r}" if turn.key else "a turn"
    try:
        messages = json.loads(turn.prompt)
    except (json.JSONDecodeError, TypeError) as exc:
        raise DataMismatch(f"{where}: prompt is not rollouts.prompts.render JSON ({exc})") from exc
    if not isinstance(messages, list) or not messages:
        raise DataMismatch(f"{where}: prompt must be a non-empty JSON list of chat messages")
    refs = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise DataMismatch(f"{where}: message {i} is not a chat message with a role")
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise DataMismatch(f"{where}: message {i} content is neither text nor a part list")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                if not url.startswith(BLOB_REF):
                    raise DataMismatch(
                        f"{where}: message {i} has an image that is not a {BLOB_REF} reference "
                        "(prompts must be rollouts.prompts.render output)"
                    )
                refs.append((part, url[len(BLOB_REF) :]))
            elif kind != "text":
                raise DataMismatch(f"{where}: message {i} has a part of type {kind!r}")
    if messages[-1]["role"] == "assistant":
        raise DataMismatch(f"{where}: prompt ends with an assistant message (reply included?)")
    if len(refs) != len(turn.images):
        raise DataMismatch(
            f"{where}: prompt references {len(refs)} image(s) but the turn carries "
            f"{len(turn.images)}"
        )
    for k, ((part, digest), png) in enumerate(zip(refs, turn.images, strict=True)):
        if hashlib.sha256(png).hexdigest() != digest:
            raise DataMismatch(
                f"{where}: image {k} does not match its reference sha256:{digest[:12]}… "
                "(images out of order or re-encoded?)"
            )
        part["image_url"] = {**part["image_url"], "url": DATA_URL + base64.b64encode(png).decode()}
    return messages


def reply_weights(completion: str, offsets: Sequence[tuple[int, int]], lam: float) -> list[float]:
    """Per-token weights of a reply: ``lam`` for tokens wholly before its last ``Action:`` line,
    1 for the rest (and for all of a reply without one)."""
    starts = [m.start() for m in _ACTION_LINE.finditer(completion)]
    if not starts:
        return [1.0] * len(offsets)
    cut = starts[-1]
    return [lam if end <= cut else 1.0 for _, end in offsets]


_MEDIA_TOKENS = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)


def media_token_ids(model: Any, processor: Any) -> frozenset[int]:
    """The ids that stand for images or videos in a prompt (the model config's and the
    processor's): a reply that sampled one cannot be replayed through the model as text (it
    would ask for an image that is not there), so such a reply is tokenised from its text."""
    cfg = getattr(model, "config", None)
    found = {getattr(cfg, name, None) for name in _MEDIA_TOKENS} | {image_token_id(processor)}
    return frozenset(i for i in found if isinstance(i, int) and i >= 0)


class VLMTrainable:
    """A Hugging Face VLM (any folder ``rollouts.hf.load_model`` reads) as a trainable policy.

    ``module``: the torch module trained (the peft wrapper when LoRA is on).
    ``reasoning_weight``: λ of the RL4VLM log-prob (see the module docstring)."""

    kind = "vlm"

    def __init__(
        self,
        model: Any,
        processor: Any,
        *,
        reasoning_weight: float = 1.0,
        lora: dict[str, Any] | None = None,
    ) -> None:
        if reasoning_weight < 0:
            raise ValueError(f"reasoning_weight must be >= 0, got {reasoning_weight}")
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.reasoning_weight = float(reasoning_weight)
        self.lora = dict(lora) if lora is not None else None
        self.module = _with_lora(model, self.lora) if self.lora is not None else model
        self.media_ids = media_token_ids(model, processor)
        self.end_id = end_of_turn_id(processor)
        self._encoded: dict[str, _Encoded] = {}  # encode()'s cache: epochs re-read the turns
        self._encoded_bytes = 0

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        lora: dict[str, Any] | None = None,
        bf16: bool = False,
        gradient_checkpointing: bool = False,
        reasoning_weight: float = 1.0,
        device: str | None = None,
    ) -> VLMTrainable:
        """Load a model folder (or hub id) for training.

        ``lora``: keyword arguments of ``peft.LoraConfig`` (``r``, ``lora_alpha``, …); without
        ``target_modules`` the language model's projections. ``bf16`` and
        ``gradient_checkpointing`` apply on CUDA only; on a CPU they are ignored with a warning.
        ``device``: default ``cuda`` when available, else ``cpu``."""
        import torch

        model, proc = load_model(path)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        on_cuda = device.startswith("cuda")
        for flag, name in ((bf16, "bf16"), (gradient_checkpointing, "gradient_checkpointing")):
            if flag and not on_cuda:
                warnings.warn(
                    f"VLMTrainable: {name} applies on CUDA only; ignored on {device}", stacklevel=2
                )
        if bf16 and on_cuda:
            model = model.to(torch.bfloat16)
        model = model.to(device)
        if gradient_checkpointing and on_cuda:
            enable_gradient_checkpointing(model)
        return cls(model, proc, reasoning_weight=reasoning_weight, lora=lora)

    # -- the TrainablePolicy protocol ---------------------------------------------------------

    def parameters(self) -> Iterator[Any]:
        """The parameters that train (LoRA: the adapters only; else all of them)."""
        return (p for p in self.module.parameters() if p.requires_grad)

    def train(self, mode: bool = True) -> VLMTrainable:
        self.module.train(mode)
        return self

    def check_data(self, turns: Sequence[Turn]) -> None:
        """:class:`DataMismatch` for an empty list, a prompt that is not a rendered webloop
        prompt, images that do not match the prompt's references (count or sha256), or images
        for a model without a vision tower."""
        if not turns:
            raise DataMismatch("no turns to train on (empty dataset or split)")
        vision = _has_vision(self.module, self.processor)
        for i, t in enumerate(turns):
            if not isinstance(t, Turn):
                raise DataMismatch(f"item {i} is a {type(t).__name__}, not a training Turn")
            turn_messages(t)
            if t.images and not vision:
                raise DataMismatch(
                    f"turn {t.key or i!r} has {len(t.images)} image(s) but the model has no "
                    "vision tower (or its processor no image processor)"
                )

    def logprobs(self, batch: Sequence[Turn]) -> TurnLogprobs:
        """Differentiable reasoning-weighted reply log-probs of a batch (see module docstring)."""
        import torch

        if not batch:
            raise DataMismatch("logprobs of an empty batch")
        enc = [self.encode(t) for t in batch]
        inputs, n_keep = self._collate(enc)
        out = self.module(**inputs, use_cache=False, logits_to_keep=n_keep)
        logits = out.logits.float()  # [B, n_keep, V]: the last n_keep positions
        dev = logits.device
        lp_rows, n_rows = [], []
        for i, e in enumerate(enc):
            c = len(e.reply_ids)
            # positions predicting the reply: the c positions before the last one
            rows = logits[i, n_keep - 1 - c : n_keep - 1]
            target = torch.tensor(e.reply_ids, device=dev)
            w = torch.tensor(e.reply_weights, device=dev)
            token_lp = torch.log_softmax(rows, -1).gather(-1, target[:, None])[:, 0]
            lp_rows.append((token_lp * w).sum())
            n_rows.append(w.sum())
        return TurnLogprobs(
            logprob=torch.stack(lp_rows),
            n_tokens=torch.stack(n_rows),
            covered=torch.tensor([e.covered for e in enc], device=dev),
        )

    def token_logprobs(self, turn: Turn, reply_ids: Sequence[int]) -> list[float]:
        """The log-prob of each of ``reply_ids`` (exactly these tokens, no end-of-turn token,
        unweighted) after ``turn``'s prompt, without gradients: what a server reports for the
        tokens it chose, for checking that trainer and server agree (RL's log-prob parity)."""
        import torch

        if not reply_ids:
            return []
        enc = dataclasses.replace(
            self.encode(turn), reply_ids=list(reply_ids), reply_weights=[1.0] * len(reply_ids)
        )
        inputs, n_keep = self._collate([enc])
        with torch.no_grad():
            logits = self.module(**inputs, use_cache=False, logits_to_keep=n_keep).logits.float()
        rows = torch.log_softmax(logits[0, : n_keep - 1], -1)
        target = torch.tensor(enc.reply_ids, device=rows.device)
        return rows.gather(-1, target[:, None])[:, 0].tolist()

    def save(self, path: str | Path, state_dict: dict[str, Any] | None = None) -> None:
        """``save_pretrained`` of the model and processor; with LoRA, the MERGED weights (base +
        adapter; the live model keeps its adapters), so ``rollouts.hf.load_model`` and the ``hf``
        policy load the folder like any checkpoint, without peft. ``state_dict``: the weights
        to write instead of the module's own (the full state gathered from fsdp shards)."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if state_dict is not None:  # gathered from a sharded (fsdp) module
            self.module.save_pretrained(out, state_dict=state_dict)
        elif self.lora is None:
            self.module.save_pretrained(out)
        else:
            base = self.module.get_base_model()
            base.save_pretrained(out, state_dict=merged_state_dict(self.module))
        self.processor.save_pretrained(out)

    # -- inputs ---------------------------------------------------------------------------------

    def prompt_inputs(self, turn: Turn) -> dict[str, Any]:
        """The processor outputs of a turn's prompt (no padding): the tensors the ``hf`` rollout
        policy generates from for the same messages."""
        tmpl, images = split_messages(turn_messages(turn))
        text = prompt_text(self.processor, tmpl)
        return dict(self.processor(text=[text], images=images or None, return_tensors="pt"))

    def counts(self, batch: Sequence[Turn]) -> tuple[list[float], list[bool]]:
        """Each turn's ``n_tokens`` and ``covered`` as :meth:`logprobs` gives them, from the
        tokenizer alone (no forward): what the trainer normalises a step's loss by before its
        micro-batches run."""
        out = [self._reply(t) for t in batch]
        return [float(sum(w)) + 1.0 for _ids, w, _c in out], [c for _ids, _w, c in out]

    def _reply(self, turn: Turn) -> tuple[list[int], list[float], bool]:
        """The completion's token ids (no end-of-turn token), their weights, and whether the
        tokenizer covers it (no unknown token). The sampled ids where the turn has them."""
        tok = self.tokenizer
        lam = self.reasoning_weight
        if turn.reply_ids is not None and not self.media_ids.intersection(turn.reply_ids):
            return self._sampled_reply(turn)
        if lam == 1.0:
            ids = tok(turn.completion, add_special_tokens=False)["input_ids"]
            weights = [1.0] * len(ids)
        else:
            if not getattr(tok, "is_fast", False):
                raise DataMismatch("reasoning_weight != 1 needs a fast tokenizer (offsets)")
            enc = tok(turn.completion, add_special_tokens=False, return_offsets_mapping=True)
            ids = enc["input_ids"]
            weights = reply_weights(turn.completion, enc["offset_mapping"], lam)
        unk = getattr(tok, "unk_token_id", None)
        return ids, weights, unk is None or unk not in ids

    def _sampled_reply(self, turn: Turn) -> tuple[list[int], list[float], bool]:
        """:meth:`_reply` of a turn with sampled ids: those ids (a trailing end-of-turn id
        dropped; an id outside the vocabulary is a :class:`DataMismatch`), weighted by where
        each token's text falls in the decoded reply."""
        ids = list(turn.reply_ids or ())
        stops = {self.end_id, getattr(self.tokenizer, "eos_token_id", None)}
        while ids and ids[-1] in stops:
            ids.pop()
        vocab = self.module.get_input_embeddings().weight.shape[0]
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise DataMismatch(
                f"turn {turn.key or '?'}: sampled token id {bad} is outside the model's "
                f"vocabulary of {vocab}: the steps were sampled by a model with another tokenizer"
            )
        if self.reasoning_weight == 1.0:
            return ids, [1.0] * len(ids), True
        decode = self.tokenizer.decode
        ends = [len(decode(ids[: k + 1])) for k in range(len(ids))]
        offsets = list(zip([0, *ends[:-1]], ends, strict=True))
        return ids, reply_weights(decode(ids), offsets, self.reasoning_weight), True

    def image_check(self, turn: Turn, prompt_ids: list[int]) -> None:
        """:class:`DataMismatch` where the turn's stored image-token runs differ from those of
        the trainer's prompt ids."""
        if turn.image_spans is None:
            return
        mine = [tuple(r) for r in token_runs(prompt_ids, image_token_id(self.processor))]
        if mine != [tuple(r) for r in turn.image_spans]:
            raise DataMismatch(
                f"turn {turn.key or '?'}: the rollout's prompt held image tokens at "
                f"{list(turn.image_spans)[:4]} (start, length), the trainer's at {mine[:4]}: the "
                "engine and the trainer build the prompt differently (processor or template "
                "version)"
            )

    def encode(self, turn: Turn) -> _Encoded:
        """Prompt ids (as at rollout) + reply ids (completion + end-of-turn) and weights; cached
        by prompt, completion and sampled ids (a rendered prompt names its images by hash), the
        latest :data:`ENCODE_CACHE_BYTES` of them: the processor's image splitting and tokenising
        cost an SFT epoch of a small model more than its forward and backward passes."""
        ids = "" if turn.reply_ids is None else ",".join(map(str, turn.reply_ids))
        key = hashlib.sha256(f"{turn.prompt}\0{turn.completion}\0{ids}".encode()).hexdigest()
        hit = self._encoded.pop(key, None)
        if hit is None:
            hit = self._encode(turn)
            self._encoded_bytes += _nbytes(hit)
        self._encoded[key] = hit  # (now the latest)
        self.image_check(turn, hit.prompt_ids)  # (the cache key does not hold the runs)
        while self._encoded_bytes > ENCODE_CACHE_BYTES and len(self._encoded) > 1:
            self._encoded_bytes -= _nbytes(self._encoded.pop(next(iter(self._encoded))))
        return hit

    def _encode(self, turn: Turn) -> _Encoded:
        inputs = self.prompt_inputs(turn)
        ids, weights, covered = self._reply(turn)
        prompt_ids = inputs.pop("input_ids")
        inputs.pop("attention_mask", None)
        n = prompt_ids.shape[1]
        per_token = {
            k: v[0].tolist() for k, v in inputs.items() if v.dim() == 2 and v.shape == (1, n)
        }
        return _Encoded(
            prompt_ids=prompt_ids[0].tolist(),
            reply_ids=[*ids, self.end_id],
            reply_weights=[*weights, 1.0],
            token_extras=per_token,
            media={k: v for k, v in inputs.items() if k not in per_token},
            covered=covered,
        )

    def _collate(self, enc: list[_Encoded]) -> tuple[dict[str, Any], int]:
        """Left-padded ids + mask (as at rollout), images of all turns in order; the number of
        final positions whose logits are needed."""
        import torch

        pad = self.tokenizer.pad_token_id
        pad = self.end_id if pad is None else pad
        seqs = [e.prompt_ids + e.reply_ids for e in enc]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        dev = _device(self.module)
        inputs: dict[str, Any] = {"input_ids": ids.to(dev), "attention_mask": mask.to(dev)}
        for key in {k for e in enc for k in e.token_extras}:  # text / reply / padding: 0
            rows = [
                [0] * (width - len(s))
                + e.token_extras.get(key, [0] * len(e.prompt_ids))
                + [0] * len(e.reply_ids)
                for s, e in zip(seqs, enc, strict=True)
            ]
            inputs[key] = torch.tensor(rows, device=dev)
        dtype = next(p for p in self.module.parameters()).dtype
        for key in {k for e in enc for k in e.media}:
            if _row_media(key, enc):  # Idefics3: one row of images per turn, zero-padded
                value = _stack_rows([e.media.get(key) for e in enc]).to(dev)
            else:  # Qwen-VL: the images of all turns, in turn order, along dim 0
                value = torch.cat([e.media[key] for e in enc if key in e.media]).to(dev)
            inputs[key] = value.to(dtype) if value.is_floating_point() else value
        return inputs, max(len(e.reply_ids) for e in enc) + 1


# -- helpers --------------------------------------------------------------------------------------

# Processor outputs laid out per prompt: [1, images, ...] (Idefics3 / SmolVLM: pixel_values
# [1, n, 3, H, W] and pixel_attention_mask [1, n, H, W]); Qwen-VL's are flat (patches, dim).
_ROW_MEDIA_DIMS = {"pixel_values": 5, "pixel_attention_mask": 4}


def _nbytes(e: _Encoded) -> int:
    """About what an encoded turn holds in memory (its tensors and its token lists)."""
    tensors = sum(v.numel() * v.element_size() for v in e.media.values() if hasattr(v, "numel"))
    return tensors + 8 * (len(e.prompt_ids) + len(e.reply_ids))


def _row_media(key: str, enc: list[_Encoded]) -> bool:
    dims = _ROW_MEDIA_DIMS.get(key)
    return dims is not None and any(key in e.media and e.media[key].dim() == dims for e in enc)


def _stack_rows(values: list[Any]) -> Any:
    """Per-turn ``[1, n_i, ...]`` tensors as one ``[B, max n, ...]`` tensor, zero-padded in
    every dimension (a turn without images gets a row of zeros). Idefics3 drops all-zero
    images and masks padded pixels with ``pixel_attention_mask``, so padding changes nothing."""
    import torch

    present = [v for v in values if v is not None]
    shape = [max(v.shape[d] for v in present) for d in range(1, present[0].dim())]
    out = torch.zeros((len(values), *shape), dtype=present[0].dtype)
    for i, v in enumerate(values):
        if v is not None:
            out[(i, *(slice(0, n) for n in v.shape[1:]))] = v[0]
    return out


def end_of_turn_id(processor: Any) -> int:
    """The token that ends an assistant turn (:func:`rollouts.hf.end_of_turn_token`);
    :class:`DataMismatch` where the tokenizer has none."""
    end = end_of_turn_token(processor)
    if end is None:
        raise DataMismatch("the tokenizer has no end-of-turn/eos token to end replies with")
    return end


def enable_gradient_checkpointing(model: Any) -> None:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    model.config.use_cache = False


def merged_state_dict(peft_model: Any) -> dict[str, Any]:
    """The base model's state dict with every LoRA layer merged (``W + ΔW``) under its plain
    name; the live model is not modified."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    sd = {k: v for k, v in base.state_dict().items() if ".lora_" not in k}
    for name, mod in base.named_modules():
        if isinstance(mod, LoraLayer):
            w = sd.pop(f"{name}.base_layer.weight")
            for adapter in mod.active_adapters:
                w = w + mod.get_delta_weight(adapter).to(w.dtype)
            sd[f"{name}.weight"] = w.detach()
            if f"{name}.base_layer.bias" in sd:
                sd[f"{name}.bias"] = sd.pop(f"{name}.base_layer.bias")
    return {k.replace(".base_layer.", "."): v.detach().contiguous() for k, v in sd.items()}


def _with_lora(model: Any, lora: dict[str, Any]) -> Any:
    from peft import LoraConfig, get_peft_model

    kw = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, **lora}
    kw.setdefault("target_modules", DEFAULT_LORA_TARGETS)
    return get_peft_model(model, LoraConfig(**kw))


def _has_vision(model: Any, processor: Any) -> bool:
    cfg = getattr(model, "config", None)
    return (
        getattr(cfg, "vision_config", None) is not None
        and getattr(processor, "image_processor", None) is not None
    )


def _device(module: Any) -> Any:
    return next(module.parameters()).device
