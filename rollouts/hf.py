"""In-process transformers models: loading, batched generation, and the ``hf`` policy.

:class:`HFGenerator` serves many concurrent trajectories from one model: requests queue up and
are generated together in batches (left-padded) in a worker thread, so the event loop keeps
stepping browsers meanwhile. The same generator backs ``webloop serve-model`` (an
OpenAI-compatible server over a transformers model, for machines without vLLM).

:class:`ImageOnlyProcessor` is a Qwen2-VL processor without the video processor (which needs
torchvision, unavailable beside the CPU torch here); tiny offline models use it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollouts.actions import parse_action
from rollouts.policies import PolicyContext, PolicyOutput, register
from rollouts.prompts import PromptConfig, build_messages


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
    """A PIL image from a ``data:image/...;base64,`` URL."""
    from PIL import Image

    if not url.startswith("data:"):
        raise ValueError("only data: image URLs are accepted (no network fetches)")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


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
    text: str
    token_logprobs: list[tuple[str, float]]
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Request:
    messages: list[dict[str, Any]]
    max_new_tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class HFGenerator:
    """Batched generation over one model for many concurrent callers."""

    model: Any
    processor: Any
    max_batch: int = 8
    wait_s: float = 0.01
    _queue: list[_Request] = field(default_factory=list)
    _cv: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    batches: int = 0

    async def generate(
        self, messages: list[dict[str, Any]], max_new_tokens: int = 64
    ) -> Generation:
        loop = asyncio.get_running_loop()
        req = _Request(messages, max_new_tokens, loop.create_future(), loop)
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, daemon=True, name="hf-generator"
                )
                self._thread.start()
            self._queue.append(req)
            self._cv.notify()
        return await req.future

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
            time.sleep(self.wait_s)  # let concurrent requests join the batch
            with self._cv:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                results = self.run_batch(
                    [r.messages for r in batch], max(r.max_new_tokens for r in batch)
                )
                for r, res in zip(batch, results, strict=True):
                    r.loop.call_soon_threadsafe(_resolve, r.future, res, None)
            except Exception as exc:
                for r in batch:
                    r.loop.call_soon_threadsafe(_resolve, r.future, None, exc)

    def run_batch(self, batch: list[list[dict[str, Any]]], max_new_tokens: int) -> list[Generation]:
        import torch

        proc, tok = self.processor, getattr(self.processor, "tokenizer", self.processor)
        texts, images = [], []
        for messages in batch:
            tmpl, imgs = split_messages(messages)
            texts.append(proc.apply_chat_template(tmpl, add_generation_prompt=True, tokenize=False))
            images.extend(imgs)
        inputs = proc(text=texts, images=images or None, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tok.pad_token_id,
            )
        self.batches += 1
        n_prompt = inputs["input_ids"].shape[1]
        gen = out.sequences[:, n_prompt:]
        logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        results = []
        for i in range(len(batch)):
            ids = gen[i].tolist()
            end = next((k for k, t in enumerate(ids) if t in _stop_ids(tok)), len(ids))
            ids = ids[:end]
            lp = [(tok.decode([t]), float(logps[i, k, t])) for k, t in enumerate(ids)]
            results.append(
                Generation(
                    tok.decode(ids, skip_special_tokens=True),
                    lp,
                    int(inputs["attention_mask"][i].sum()),
                    len(ids),
                )
            )
        return results


def _stop_ids(tok: Any) -> set[int]:
    ids = {tok.eos_token_id, tok.pad_token_id}
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        ids.add(im_end)
    return {i for i in ids if i is not None}


def _resolve(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


@register("hf")
class HFPolicy:
    """An in-process transformers model as a policy (batched across trajectories)."""

    name = "hf"

    def __init__(
        self,
        model_path: str | None = None,
        generator: HFGenerator | None = None,
        max_new_tokens: int = 64,
        prompt: PromptConfig | None = None,
    ) -> None:
        if generator is None:
            if model_path is None:
                raise ValueError("the hf policy needs model_path or a generator")
            model, proc = load_model(model_path)
            generator = HFGenerator(model, proc)
        self.generator, self.max_new_tokens = generator, max_new_tokens
        self.prompt = prompt or PromptConfig()

    async def act(self, ctx: PolicyContext) -> PolicyOutput:
        messages = build_messages(ctx.instruction, ctx.turns, self.prompt)
        start = time.perf_counter()
        gen = await self.generator.generate(messages, self.max_new_tokens)
        return PolicyOutput(
            gen.text,
            parse_action(gen.text),
            sum(lp for _, lp in gen.token_logprobs) if gen.token_logprobs else None,
            time.perf_counter() - start,
            messages,
        )


def completion_body(model_name: str, gen: Generation, logprobs: bool) -> dict[str, Any]:
    """An OpenAI chat.completion JSON body for a generation."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": "stop",
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
