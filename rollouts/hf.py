"""In-process transformers models: loading, batched generation, and the ``hf`` policy.

:class:`HFGenerator` serves many concurrent trajectories from one model: requests queue up and
are generated together in batches (left-padded) in a worker thread, so the event loop keeps
stepping browsers meanwhile. Each request carries its own sampling parameters (greedy at
temperature 0, else seeded sampling per row: :class:`Sampling`). The same generator backs
``webloop serve-model`` (an OpenAI-compatible server over a transformers model, for machines
without vLLM).

:class:`ImageOnlyProcessor` is a Qwen2-VL processor without the video processor (which needs
torchvision, unavailable beside the CPU torch here); tiny offline models use it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollouts.actions import parse_action
from rollouts.batching import BatchWorker
from rollouts.policies import PolicyContext, PolicyOutput, register
from rollouts.prompts import PromptConfig, build_messages

#: How :class:`HFPolicy` acts: on its generated reply, or on the best of the candidate actions.
CHOICES = ("generate", "candidates")


def _processor_classes() -> dict[str, Any]:
    from transformers import ProcessorMixin
    from transformers.models.qwen2_vl import Qwen2VLProcessor

    class ImageOnlyProcessor(Qwen2VLProcessor):
        """Qwen2-VL's processor for images only (no video processor, so no torchvision)."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kw):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    return {"ImageOnlyProcessor": ImageOnlyProcessor}


def image_only_processor_class() -> Any:
    return _processor_classes()["ImageOnlyProcessor"]


def load_model(path: str | Path) -> tuple[Any, Any]:
    """A vision-language model and its processor from a folder (or a hub id, with network)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    cfg_file = Path(path) / "processor_config.json"
    custom = cfg_file.exists() and "ImageOnlyProcessor" in cfg_file.read_text()
    proc = (
        image_only_processor_class().from_pretrained(path)
        if custom
        else AutoProcessor.from_pretrained(path)
    )
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    tok = getattr(proc, "tokenizer", proc)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, proc


def decode_image(url: str) -> Any:
    """A PIL image from a ``data:image/...;base64,`` URL, decoded under the warehouse's pixel
    budget (:func:`warehouse.images.validate_image`): a decompression bomb or corrupt pixel data
    is a ``ValueError`` saying why, before the image is allocated."""
    from PIL import Image

    from warehouse.images import validate_image

    if not isinstance(url, str) or not url.startswith("data:"):
        raise ValueError("only data: image URLs are accepted (no network fetches)")
    try:
        data = base64.b64decode(url.split(",", 1)[1], validate=True)
    except (IndexError, ValueError):
        raise ValueError("an image URL is not valid base64 data") from None
    problem = validate_image(data)
    if problem:
        raise ValueError(f"refusing an image: {problem}")
    return Image.open(io.BytesIO(data)).convert("RGB")


def split_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """OpenAI-format messages → (template messages with image placeholders, PIL images)."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for c in content:
                if c.get("type") == "image_url":
                    images.append(decode_image(c["image_url"]["url"]))
                    parts.append({"type": "image"})
                elif c.get("type") == "text":
                    parts.append({"type": "text", "text": c.get("text", "")})
            out.append({"role": m["role"], "content": parts})
        else:
            out.append({"role": m["role"], "content": str(content or "")})
    return out, images


@dataclass
class Generation:
    """One reply: its text, the (token, log-prob) pairs of its tokens, token counts and why it
    ended: ``stop`` (an end-of-turn token) or ``length`` (the token limit cut it)."""

    text: str
    token_logprobs: list[tuple[str, float]]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"
    pieces: list[str] = field(default_factory=list)  # the text each token adds (streaming)
    token_ids: list[int] = field(default_factory=list)  # the reply's token ids, in order
    # where the image placeholder tokens sit in the prompt's ids: [start, length] runs
    image_spans: list[list[int]] = field(default_factory=list)


def image_token_id(processor: Any) -> int | None:
    """The id of the processor's image placeholder token (None: a text-only processor)."""
    found = getattr(processor, "image_token_id", None)
    if isinstance(found, int):
        return found
    token = getattr(processor, "image_token", None)
    tok = getattr(processor, "tokenizer", None)
    if isinstance(token, str) and tok is not None:
        tid = tok.convert_tokens_to_ids(token)
        return tid if isinstance(tid, int) and tid != tok.unk_token_id else None
    return None


def token_runs(ids: list[int], token: int | None) -> list[list[int]]:
    """The ``[start, length]`` runs of ``token`` in ``ids`` (none for ``token`` None)."""
    runs: list[list[int]] = []
    if token is None:
        return runs
    for k, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == k:
            runs[-1][1] += 1
        else:
            runs.append([k, 1])
    return runs


@dataclass(frozen=True)
class Sampling:
    """How one request picks its tokens. ``temperature`` 0: greedy. Above 0: sampling from the
    distribution at that temperature, restricted to the top-``top_p`` nucleus, with its own
    random generator seeded by ``seed`` (None: a fresh random seed), so a seeded request gives
    the same reply whatever it is batched with (up to float noise of padding)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


GREEDY = Sampling()


Prompt = list[dict[str, Any]] | str  # OpenAI chat messages, or raw text (no chat template)


@dataclass
class _Request:
    messages: Prompt
    max_new_tokens: int
    sampling: Sampling


def prompt_text(processor: Any, template_messages: list[dict[str, Any]]) -> str:
    """The chat-template text a model generates from (with the generation prompt); training
    (:mod:`training.vlm`) tokenises prompts through this same function."""
    return processor.apply_chat_template(
        template_messages, add_generation_prompt=True, tokenize=False
    )


def model_inputs(processor: Any, batch: list[Prompt]) -> Any:
    """Processor outputs (left-padded ids, mask, pixel values) for a batch of prompts: OpenAI
    messages (through the chat template) or raw text (as is, for ``/v1/completions``)."""
    texts, images = [], []
    for messages in batch:
        if isinstance(messages, str):
            texts.append(messages)
            continue
        tmpl, imgs = split_messages(messages)
        texts.append(prompt_text(processor, tmpl))
        images.extend(imgs)
    return processor(text=texts, images=images or None, return_tensors="pt", padding=True)


def end_of_turn_token(processor: Any) -> int | None:
    """The token that ends an assistant turn in the processor's chat template (the first token
    the template writes after the reply), else the tokenizer's eos (None without one). Training
    ends every reply with it; :meth:`HFGenerator.score_replies` scores it."""
    tok = getattr(processor, "tokenizer", processor)
    mark = "\x00REPLY\x00"
    try:
        text = processor.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}],
            tokenize=False,
        )
        after = text.split(mark, 1)[1]
        first = tok(after, add_special_tokens=False)["input_ids"][:1] if after else []
        if first and first[0] in set(tok.all_special_ids):
            return int(first[0])
    except Exception:  # a template that cannot render string content: fall back to eos
        pass
    return None if tok.eos_token_id is None else int(tok.eos_token_id)


class _RowSampler:
    """A logits processor that samples each row with its own parameters and generator and
    leaves only the drawn token (greedy decoding then takes it); greedy rows pass through."""

    def __init__(self, params: list[Sampling], device: Any) -> None:
        import torch

        self.params = params
        self.generators = []
        for p in params:
            g = None
            if p.temperature > 0:
                seed = p.seed if p.seed is not None else int(torch.randint(0, 2**62, ()).item())
                g = torch.Generator(device=device).manual_seed(seed)
            self.generators.append(g)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        out = scores.clone()
        for i, (p, g) in enumerate(zip(self.params, self.generators, strict=True)):
            if g is None:
                continue
            probs = torch.softmax(scores[i].float() / p.temperature, -1)
            if p.top_p < 1:
                sorted_p, order = probs.sort(descending=True)
                drop = sorted_p.cumsum(-1) - sorted_p >= p.top_p  # keep the top-p nucleus
                sorted_p[drop] = 0
                probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
            tok = torch.multinomial(probs, 1, generator=g)
            out[i] = float("-inf")
            out[i, tok] = 0.0
        return out


@dataclass
class HFGenerator:
    """Batched generation over one model for many concurrent callers.

    Requests with different sampling parameters share batches: each row is sampled with its own
    temperature, top-p and seeded generator (:class:`Sampling`). Reported log-probs are those
    of the chosen tokens under the model's own (untempered, unfiltered) distribution, the
    numbers a trainer recomputes."""

    model: Any
    processor: Any
    max_batch: int = 8
    wait_s: float = 0.01
    batches: int = 0
    _worker: BatchWorker | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def swap(self, model: Any, processor: Any) -> None:
        """Generate with ``model`` and ``processor`` from the next batch on (a weight sync: the
        batch running now finishes with the old ones)."""
        with self._lock:
            self.model, self.processor = model, processor

    async def generate(
        self,
        messages: Prompt,
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> Generation:
        """Generate one reply (batched with concurrent requests) to chat ``messages`` or a raw
        text prompt. ``temperature`` 0 is greedy; above 0 samples (reproducibly when ``seed`` is
        given)."""
        if self._worker is None:
            self._worker = BatchWorker(
                self._run_requests,
                max_batch=self.max_batch,
                wait_s=self.wait_s,
                name="hf-generator",
            )
        sampling = Sampling(float(temperature), float(top_p), seed)
        return await self._worker.submit(_Request(messages, max_new_tokens, sampling))

    def _run_requests(self, batch: list[_Request]) -> list[Generation]:
        return self.run_batch(
            [r.messages for r in batch],
            max(r.max_new_tokens for r in batch),
            sampling=[r.sampling for r in batch],
            limits=[r.max_new_tokens for r in batch],
        )

    def run_batch(
        self,
        batch: list[Prompt],
        max_new_tokens: int,
        *,
        sampling: list[Sampling] | None = None,
        limits: list[int] | None = None,
    ) -> list[Generation]:
        """Generate for a batch of prompts (message lists or raw text). ``sampling``: per-row
        parameters (default greedy); ``limits``: per-row token limits (default
        ``max_new_tokens``)."""
        with self._lock:
            return self._run_batch(batch, max_new_tokens, sampling, limits)

    def _run_batch(
        self,
        batch: list[Prompt],
        max_new_tokens: int,
        sampling: list[Sampling] | None,
        limits: list[int] | None,
    ) -> list[Generation]:
        import torch
        from transformers import LogitsProcessorList

        proc, tok = self.processor, getattr(self.processor, "tokenizer", self.processor)
        params = sampling or [GREEDY] * len(batch)
        limits = limits or [max_new_tokens] * len(batch)
        if len(params) != len(batch) or len(limits) != len(batch):
            raise ValueError("run_batch: one sampling and one limit per request")
        device = getattr(self.model, "device", "cpu")
        inputs = model_inputs(proc, batch).to(device)
        extra = {}
        if any(p.temperature > 0 for p in params):
            extra["logits_processor"] = LogitsProcessorList([_RowSampler(params, device)])
        with torch.no_grad():
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=tok.pad_token_id,
                **extra,
            )
        self.batches += 1
        n_prompt = inputs["input_ids"].shape[1]
        gen = out.sequences[:, n_prompt:]
        logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.logits], 1)
        results = []
        image_id = image_token_id(proc)
        for i in range(len(batch)):
            prompt_ids = inputs["input_ids"][i][inputs["attention_mask"][i].bool()].tolist()
            ids = gen[i].tolist()[: limits[i]]
            stops = _stop_ids(tok)
            end = next((k for k, t in enumerate(ids) if t in stops), None)
            finish = "length" if end is None else "stop"
            ids = ids if end is None else ids[:end]
            lp = [(tok.decode([t]), float(logps[i, k, t])) for k, t in enumerate(ids)]
            text, pieces = _pieces(tok, ids)
            results.append(
                Generation(
                    text,
                    lp,
                    len(prompt_ids),
                    len(ids),
                    finish,
                    pieces,
                    ids,
                    token_runs(prompt_ids, image_id),
                )
            )
        return results

    def score_replies(self, messages: Prompt, replies: list[str], chunk: int = 8) -> list[float]:
        """The log-prob of each of ``replies`` after the chat ``messages`` (its tokens and the
        end-of-turn token, as training writes a reply), without gradients, ``chunk`` replies per
        forward pass: :class:`HFPolicy`'s ``candidates`` choice ranks actions by it. The prompt
        is processed once; where the model's positions allow (all but Qwen2-VL's multimodal
        rotary ones) it also runs once and its key/value cache serves every chunk."""
        import torch

        with self._lock, torch.no_grad():
            proc = self.processor
            tok = getattr(proc, "tokenizer", proc)
            end = end_of_turn_token(proc)
            device = getattr(self.model, "device", "cpu")
            inputs = model_inputs(proc, [messages]).to(device)
            tail = [] if end is None else [end]
            rows = [tok(r, add_special_tokens=False)["input_ids"] + tail for r in replies]
            pad = tok.pad_token_id if tok.pad_token_id is not None else (end or 0)
            n = inputs["input_ids"].shape[1]
            first = None
            if "image_grid_thw" not in inputs:  # multimodal rotary positions: no cache reuse
                first = self.model(**inputs, use_cache=True, logits_to_keep=1)
            out: list[float] = []
            for i in range(0, len(rows), chunk):
                part = rows[i : i + chunk]
                width = max(len(r) for r in part)
                ids = torch.tensor([r + [pad] * (width - len(r)) for r in part], device=device)
                mask = [[1] * (n + len(r)) + [0] * (width - len(r)) for r in part]
                mask = torch.tensor(mask, device=device)
                if first is None:
                    logits = self._whole(inputs, ids, mask, width)
                else:
                    logits = self._after_cache(first, ids, mask, n, width)
                out += _reply_logprobs(logits, part)
            return out

    def _after_cache(self, first: Any, ids: Any, mask: Any, n: int, width: int) -> Any:
        """The replies after the prompt's pass ``first``: its key/value cache repeated for them."""
        import copy

        import torch

        cache = copy.deepcopy(first.cache)  # (transformers 5: ``cache``, not past_key_values)
        cache.batch_repeat_interleave(len(ids))
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            cache=cache,
            cache_position=torch.arange(n, n + width, device=ids.device),
            use_cache=True,
        )
        # the prompt's last position predicts each reply's first token
        return torch.cat([first.logits[:, -1:].expand(len(ids), 1, -1), out.logits[:, :-1]], 1)

    def _whole(self, inputs: Any, ids: Any, mask: Any, width: int) -> Any:
        """Prompt and reply in one pass per row (right-padded: the prompt's positions are
        those it has at generation)."""
        import torch

        b = len(ids)
        batch = {
            "input_ids": torch.cat([inputs["input_ids"].repeat(b, 1), ids], 1),
            "attention_mask": mask,
            **_repeated_media(inputs, inputs["input_ids"].shape[1], b, width),
        }
        out = self.model(**batch, use_cache=False, logits_to_keep=width + 1)
        return out.logits[:, :-1]


def _reply_logprobs(logits: Any, rows: list[list[int]]) -> list[float]:
    """Each row's summed log-prob of its own tokens (``logits[:, j]`` predicts token ``j``)."""
    import torch

    logp = torch.log_softmax(logits.float(), -1)
    return [
        float(logp[k, : len(r)].gather(-1, torch.tensor(r, device=logp.device)[:, None]).sum())
        for k, r in enumerate(rows)
    ]


def _repeated_media(inputs: Any, n: int, b: int, width: int) -> dict[str, Any]:
    """A one-prompt processor output's other tensors for ``b`` rows of that prompt followed by
    ``width`` reply positions (per-token extras padded with zeros; Qwen2-VL's flat patches
    concatenated)."""
    import torch

    flat = "image_grid_thw" in inputs
    out = {}
    for k, v in inputs.items():
        if k in ("input_ids", "attention_mask") or not isinstance(v, torch.Tensor):
            continue
        if v.dim() == 2 and tuple(v.shape) == (1, n):
            out[k] = torch.cat([v, v.new_zeros(1, width)], 1).repeat(b, 1)
        elif flat and k in ("pixel_values", "image_grid_thw"):
            out[k] = torch.cat([v] * b)
        else:
            out[k] = v.repeat(b, *([1] * (v.dim() - 1)))
    return out


def _pieces(tok: Any, ids: list[int]) -> tuple[str, list[str]]:
    """The decoded text of ``ids`` and the text each token adds to it (a token that ends
    inside a multi-byte character adds "" and the next one the whole character)."""
    pieces, prev = [], ""
    for k in range(len(ids)):
        cur = tok.decode(ids[: k + 1], skip_special_tokens=True)
        if cur.endswith("\ufffd") and k < len(ids) - 1:  # a split character: wait for more
            pieces.append("")
            continue
        pieces.append(cur[len(prev) :] if cur.startswith(prev) else cur)
        prev = cur
    text = tok.decode(ids, skip_special_tokens=True)
    if "".join(pieces) != text:  # decoding is not prefix-stable here: one piece per reply
        pieces = [text] + [""] * (len(ids) - 1) if ids else []
    return text, pieces


def _stop_ids(tok: Any) -> set[int]:
    ids = {tok.eos_token_id, tok.pad_token_id}
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        ids.add(im_end)
    return {i for i in ids if i is not None}


@register("hf")
class HFPolicy:
    """An in-process transformers model as a policy (batched across trajectories).

    ``temperature`` 0 (default): greedy. Above 0: sampled (``top_p`` nucleus), each call seeded
    from the episode's ``ctx.rng``, so a run is reproducible while the samples of a group (other
    sample indices, other rng streams) differ. ``logprob``: the sum over the reply's tokens under
    the untempered model (end-of-turn token not included).

    ``choose``: ``generate`` (default) acts on the generated reply; ``candidates`` keeps the
    generated thought, then scores every candidate action the ranker's generator proposes at the
    page (:func:`rollouts.ranker.candidate.candidates`) as the reply's ending and takes the most
    likely (sampled from their softmax at ``temperature`` above 0): a constrained decode that
    never writes a malformed action or a ref the page lacks. ``logprob`` is then the chosen
    reply's, end-of-turn token included. Without a parseable webloop prompt it acts as
    ``generate`` does."""

    name = "hf"

    def __init__(
        self,
        model_path: str | None = None,
        generator: HFGenerator | None = None,
        max_new_tokens: int = 64,
        prompt: PromptConfig | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        choose: str = "generate",
    ) -> None:
        Sampling(temperature, top_p)  # validates
        if choose not in CHOICES:
            raise ValueError(f"choose is one of {', '.join(CHOICES)}, not {choose!r}")
        if generator is None:
            if model_path is None:
                raise ValueError("the hf policy needs model_path or a generator")
            model, proc = load_model(model_path)
            generator = HFGenerator(model, proc)
        self.generator, self.max_new_tokens = generator, max_new_tokens
        self.prompt = prompt or PromptConfig()
        self.temperature, self.top_p, self.choose = temperature, top_p, choose

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        messages = build_messages(ctx.instruction, ctx.turns, self.prompt)
        seed = ctx.rng.getrandbits(63) if self.temperature > 0 else None
        start = time.perf_counter()
        gen = await self.generator.generate(
            messages,
            self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
        )
        text = gen.text
        logprob = sum(lp for _, lp in gen.token_logprobs) if gen.token_logprobs else None
        token_ids: tuple[int, ...] | None = tuple(gen.token_ids)
        if self.choose == "candidates":
            best = await asyncio.to_thread(self._best_candidate, messages, text, ctx.rng)
            if best is not None:
                text, logprob = best
                token_ids = None  # a reply the model scored, not the tokens it sampled
        return PolicyOutput(
            text,
            parse_action(text),
            logprob,
            time.perf_counter() - start,
            messages,
            token_ids=token_ids,
            image_spans=tuple(tuple(r) for r in gen.image_spans),
        )

    def _best_candidate(
        self, messages: list[dict[str, Any]], generated: str, rng: Any
    ) -> tuple[str, float] | None:
        """The generated thought ended by the candidate action the model finds most likely (or
        sampled at ``temperature``), and that reply's log-prob; None without candidates."""
        from rollouts.ranker.candidate import candidates
        from rollouts.ranker.prompt import NotAWebloopPrompt, parse_prompt

        try:
            cands = candidates(parse_prompt(messages))
        except NotAWebloopPrompt:
            return None
        if not cands:
            return None
        head, mark, _ = generated.partition("Action:")
        prefix = head + mark if mark else "Action:"
        replies = [f"{prefix} {c.text}" for c in cands]
        scores = self.generator.score_replies(messages, replies)
        if self.temperature == 0:
            i = max(range(len(scores)), key=scores.__getitem__)
        else:
            top = max(scores)
            weights = [math.exp((s - top) / self.temperature) for s in scores]
            i = rng.choices(range(len(scores)), weights=weights)[0]
        return replies[i], scores[i]


def completion_body(model_name: str, gen: Generation, logprobs: bool) -> dict[str, Any]:
    """An OpenAI chat.completion JSON body for a generation."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": gen.finish_reason,
        "message": {"role": "assistant", "content": gen.text},
    }
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "top_logprobs": []} for t, lp in gen.token_logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{time.time_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        },
    }
