"""GPU check of the VLM training path at production size.

Builds a Qwen2.5-VL model with 3B-class dimensions (text: hidden 2048, 36 layers, 16 heads /
2 KV heads, vocab 151,936; vision: the real 32-block, 1280-wide tower with window attention)
and random weights in bf16 on the GPU, then runs SFT steps and PPO-clip RL steps through
``training.vlm.VLMTrainable`` on synthetic webloop turns (real-size 1280x720 screenshots, an
accessibility tree, a Thought/Action reply) and prints examples/s, tokens/s, peak memory and
MFU (model FLOPs utilisation: the model's training FLOPs per second over the chip's bf16 peak).

Throughput settings: attention by flash-attention 2 where the ``flash_attn`` package is
installed, else PyTorch SDPA (``--attn``); bf16 weights; ``--gradient-checkpointing``; and a
tokenizer trained offline on webloop's prompt text and the batch's own prompts with a realistic
vocabulary (``--vocab``, default 32,000: the 1,024-token test tokenizer made prompts ~2x longer
than a production tokenizer would). It prints characters per token so the lengths can be judged.

MFU counts ``6 · params · tokens`` per training step (forward + backward), for the language
model (non-embedding parameters and the output head, over the text tokens) and the vision tower
(over the image patches), plus causal attention ``6 · layers · hidden · seq²`` per sequence; the
peak is the chip's dense bf16 figure (H100/H200 989 TFLOP/s, A100 312; ``--peak-tflops``).

Without a CUDA device it prints ``skipped: no CUDA device`` and exits 0. ``--size tiny --cpu``
runs the same code with tiny dimensions on the CPU (to check the script itself).

    python scripts/gpu_check.py [--batch 4] [--steps 3] [--images 2] [--gradient-checkpointing]
                                [--attn auto|flash_attention_2|sdpa|eager] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES: dict[str, dict[str, Any]] = {
    "3b": {
        "text": dict(
            vocab_size=151_936,
            hidden_size=2048,
            intermediate_size=11_008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            rope_theta=1_000_000.0,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
            tie_word_embeddings=True,
        ),
        "vision": dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
        ),
        "screen": (1280, 720),
    },
    "tiny": {
        "text": dict(
            vocab_size=2048,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
        ),
        "vision": dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[1],
        ),
        "screen": (320, 200),
    },
}


def build(
    size: str, device: str, bf16: bool, attn: str = "sdpa", vocab: int = 1024, texts: Any = ()
) -> tuple[Any, Any]:
    """A random-weight Qwen2.5-VL of ``size`` on ``device`` and an image-only processor; the
    tokenizer is trained on webloop's prompt text plus ``texts`` with ``vocab`` entries."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from rollouts.hf import image_only_processor_class
    from training.models import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer(vocab, corpus=list(texts))
    tok.padding_side = "left"
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    spec = SIZES[size]
    cfg = Qwen2_5_VLConfig(
        text_config={
            **spec["text"],
            "vocab_size": max(spec["text"]["vocab_size"], len(tok)),
            "max_position_embeddings": 32_768,
            "bos_token_id": None,
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config=spec["vision"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        attn_implementation=attn,
    )
    image_proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=1280 * 28 * 28)
    proc = image_only_processor_class()(
        image_processor=image_proc, tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(default)
    return model, proc


def synthetic_turns(n: int, n_images: int, screen: tuple[int, int], seed: int = 0) -> list:
    """Webloop turns with real-size noisy screenshots (rendered by the rollout prompt builder)."""
    import numpy as np
    from PIL import Image

    from rollouts.prompts import Turn as Obs
    from rollouts.prompts import build_messages, render
    from training.interface import Turn

    rng = random.Random(seed)
    gen = np.random.default_rng(seed)
    tree = "\n".join(f'- button "Item {i}" [ref=e{i}] [cursor=pointer]' for i in range(60))
    turns = []
    for i in range(n):
        shots = []
        for _ in range(n_images):
            buf = io.BytesIO()
            pixels = gen.integers(0, 256, (screen[1], screen[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
            shots.append(buf.getvalue())
        obs = [
            Obs(f"http://shop.test/{k}", f"Page {k}", s, None, f"click(e{k})")
            for k, s in enumerate(shots[:-1])
        ]
        obs.append(Obs("http://shop.test/now", "Now", shots[-1], tree))
        messages = build_messages(f"Buy item {i}", obs)
        reply = (
            f"Thought: the item {i} is in the list, so I open it and add it to the cart.\n"
            f"Action: click({rng.randrange(1280)}, {rng.randrange(720)})"
        )
        turns.append(Turn(render(messages), reply, tuple(shots), advantage=(-1.0) ** i))
    return turns


def corpus(saved: Path | None = None, n_tasks: int = 2000) -> list[str]:
    """webloop's own text for the tokenizer: the bundled sites' task instructions and page
    templates (what prompts show), beside the prompt builder's text. ``saved``: a JSON list
    written by ``--dump-corpus`` (for a GPU machine without the sites' dependencies)."""
    if saved is not None:
        return json.loads(saved.read_text())
    from sites.tasks import generate

    root = Path(__file__).resolve().parents[1] / "sites" / "templates"
    pages = [p.read_text() for p in sorted(root.rglob("*.html"))]
    return [t.instruction for t in generate(n_tasks)] + pages


def timed(fn: Any, sync: Any) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def peak_tflops(name: str, given: float | None) -> float | None:
    """The chip's dense bf16 peak: ``given``, else by the device name (None: unknown)."""
    if given:
        return given
    return next((v for k, v in PEAK_TFLOPS.items() if k in name.upper()), None)


def attention(choice: str, device: str) -> str:
    """``auto``: flash-attention 2 where its package is installed on a GPU, else SDPA."""
    if choice != "auto":
        return choice
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "sdpa"
    return "flash_attention_2" if device == "cuda" else "sdpa"


def step_flops(model: Any, pol: Any, turns: list) -> tuple[float, int, int]:
    """Training FLOPs of one step over ``turns`` (see the module docstring), text tokens and
    image patches."""
    lm = model.model.language_model
    cfg = model.config.text_config
    text_params = sum(p.numel() for n, p in lm.named_parameters() if "embed_tokens" not in n)
    head = model.lm_head.weight.numel()
    vision = sum(p.numel() for p in model.model.visual.parameters())
    enc = [pol.encode(t) for t in turns]
    seqs = [len(e.prompt_ids) + len(e.reply_ids) for e in enc]
    patches = sum(int(e.media["image_grid_thw"].prod(-1).sum()) for e in enc if e.media)
    flops = 6 * (text_params + head) * sum(seqs) + 6 * vision * patches
    flops += sum(6 * cfg.num_hidden_layers * cfg.hidden_size * n * n for n in seqs)
    return float(flops), sum(seqs), patches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="3b")
    ap.add_argument("--batch", type=int, default=4, help="turns per step")
    ap.add_argument("--steps", type=int, default=3, help="steps per phase (first one warms up)")
    ap.add_argument("--images", type=int, default=2, help="screenshots per prompt")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument(
        "--attn", default="auto", choices=["auto", "flash_attention_2", "sdpa", "eager"]
    )
    ap.add_argument("--vocab", type=int, default=32_000, help="trained tokenizer's vocabulary")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the chip's bf16 peak")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (with --size tiny)")
    ap.add_argument("--corpus", type=Path, default=None, help="tokenizer text from --dump-corpus")
    ap.add_argument("--profile", type=int, default=0, help="profile an SFT step: top N ops")
    ap.add_argument("--dump-corpus", type=Path, default=None, help="write the text and exit")
    args = ap.parse_args(argv)
    if args.dump_corpus:
        args.dump_corpus.write_text(json.dumps(corpus()))
        print(f"wrote the tokenizer text to {args.dump_corpus}")
        return 0

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    device = "cpu" if args.cpu else "cuda"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    chip = torch.cuda.get_device_name() if device == "cuda" else "cpu"

    from training.vlm import VLMTrainable, enable_gradient_checkpointing

    t0 = time.perf_counter()
    turns = synthetic_turns(args.batch, args.images, SIZES[args.size]["screen"])
    attn = attention(args.attn, device)
    texts = corpus(args.corpus) + [t.prompt + "\n" + t.completion for t in turns]
    model, proc = build(args.size, device, device == "cuda", attn, args.vocab, texts)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    pol = VLMTrainable(model, proc, reasoning_weight=0.5)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Qwen2.5-VL {args.size}, {n_params / 1e9:.2f} B params, {device} ({chip}), "
        f"attention {attn}, built in {time.perf_counter() - t0:.1f} s"
    )
    pol.check_data(turns)
    flops, tokens, patches = step_flops(model, pol, turns)
    reply_chars = sum(len(t.completion) for t in turns)
    reply_tokens = sum(len(pol.encode(t).reply_ids) - 1 for t in turns)
    print(
        f"batch: {len(turns)} turns, {args.images} screenshots each, {tokens} tokens "
        f"({patches} image patches); tokenizer {len(proc.tokenizer)} entries, "
        f"{reply_chars / max(reply_tokens, 1):.2f} characters per reply token"
    )
    opt = torch.optim.AdamW(pol.parameters(), lr=1e-6)

    def sft() -> None:
        out = pol.logprobs(turns)
        loss = (-out.logprob / out.n_tokens).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    with torch.no_grad():
        old = pol.logprobs(turns).logprob.detach()
    adv = torch.tensor([t.advantage for t in turns], device=old.device)

    def rl() -> None:
        out = pol.logprobs(turns)
        ratio = torch.exp(out.logprob - old)
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    peak = peak_tflops(chip, args.peak_tflops)
    record: dict[str, Any] = {
        "bench": "training-gpu",
        "chip": chip,
        "size": args.size,
        "params": n_params,
        "attention": attn,
        "gradient_checkpointing": args.gradient_checkpointing,
        "batch": len(turns),
        "tokens_per_step": tokens,
        "peak_tflops": peak,
    }
    pol.train()
    for name, step in (("sft", sft), ("rl-ppo-clip", rl)):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = [timed(step, sync) for _ in range(args.steps)]
        steady = times[1:] or times
        per = sum(steady) / len(steady)
        mem = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        achieved = flops / per / 1e12
        mfu = f"MFU {achieved / peak:.1%}" if peak else "MFU: unknown chip (--peak-tflops)"
        print(
            f"{name}: first step {times[0]:.2f} s, steady {per:.3f} s/step, "
            f"{len(turns) / per:.2f} examples/s, {tokens / per:.0f} tokens/s, "
            f"{achieved:.1f} TFLOP/s, {mfu}, peak memory {mem:.1f} GiB"
        )
        record[name] = {
            "s_per_step": per,
            "examples_per_s": len(turns) / per,
            "tokens_per_s": tokens / per,
            "tflops": achieved,
            "mfu": achieved / peak if peak else None,
        }
    if args.profile:
        profile(sft, device, args.profile)
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2))
    return 0


def profile(step: Any, device: str, rows: int) -> None:
    """One more SFT step under torch.profiler: the ``rows`` ops that took the most device
    (or CPU) time, by their own time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profiler_quiet(), torch_profile(activities=acts) as prof:
        step()
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def torch_profiler_quiet() -> Any:
    import contextlib
    import warnings

    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


if __name__ == "__main__":
    sys.exit(main())
