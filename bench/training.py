"""Training benchmark: examples/s and tokens/s of the trainer on 1 process vs 2 (DDP, FSDP).

Same tiny VLM (``training.models.build_tiny_vlm``), same turns (webloop prompts with two
screenshots each, rendered by the rollout prompt builder), same global batch, same steps, same
seed in every arm:

- ``1 process``: :func:`training.trainer.fit` in this process with every core (the baseline);
- ``ddp x2`` / ``fsdp x2``: :func:`training.launch.fit_processes`, two ranks over gloo, the cores
  split between them.

Throughput is the median over steps (after the first) of the figures each step logs
(``examples_per_s``, ``tokens_per_s``: the global batch over the step's wall time); the whole
run's wall time, process start and model load included, is printed beside it. Scaling
efficiency = examples/s on 2 processes ÷ (2 × the baseline's). Every arm computes the same
steps: the bench prints each arm's largest loss difference from the baseline (they agree to
~1e-6), so a faster arm cannot be one that skipped work.

On 2 CPU cores two ranks cannot beat one process that already uses both cores: the CPU figures
measure the distributed machinery's overhead; the scaling that matters is GPUs'.

``--gpu``: the GPU throughput check (``scripts/gpu_check.py``: a Qwen2.5-VL-3B-shaped model,
bf16, flash-attention or SDPA, MFU) when a CUDA device is present; skipped with its reason
otherwise. Every printed line and figure goes to a results file with the code version
(``bench/results/``, or ``--results PATH``; a ``--quick`` run writes one only when asked).

    python bench/training.py [--quick] [--turns 48] [--batch 8] [--steps 6] [--arms ddp,fsdp]
                             [--gpu] [--results OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.results import Results

RESULTS: Results | None = None


def say(text: str) -> None:
    if RESULTS is not None:
        RESULTS.say(text)
    else:
        print(text, flush=True)


def make_turns(n: int) -> list:
    from scripts.gpu_check import synthetic_turns

    return synthetic_turns(n, 2, (320, 200))


def run_arm(name: str, spec: Any, turns: list, cfg: Any, out: Path, n: int, strategy: str):
    """One arm: its logged steps and wall time."""
    from training.launch import Job, fit_processes
    from training.parallel import ParallelConfig
    from training.trainer import fit

    logged: list[tuple[int, dict]] = []
    t0 = time.perf_counter()
    if n == 1:
        fit(spec.load(), turns, cfg, out, log=lambda s, v: logged.append((s, v)))
    else:
        job = Job(spec, turns, cfg, str(out), ParallelConfig(strategy))
        fit_processes(job, n, log=lambda s, v: logged.append((s, v)))
    return logged, time.perf_counter() - t0


def summary(logged: list[tuple[int, dict]]) -> dict[str, float]:
    steady = [v for s, v in logged if s > 1] or [v for _, v in logged]
    return {
        "steps": len(logged),
        "examples_per_s": statistics.median(v["examples_per_s"] for v in steady),
        "tokens_per_s": statistics.median(v["tokens_per_s"] for v in steady),
    }


def cpu_scaling(args: argparse.Namespace) -> dict[str, Any]:
    from training.load import ModelSpec
    from training.models import build_tiny_vlm
    from training.trainer import TrainConfig

    root = Path(tempfile.mkdtemp(prefix="bench-training-"))
    spec = ModelSpec(str(build_tiny_vlm(root / "tiny")), str(root))
    turns = make_turns(args.turns)
    cfg = TrainConfig(
        objective="sft", epochs=1, lr=1e-3, batch_size=args.batch, seed=0, max_steps=args.steps
    )
    say(
        f"data: {len(turns)} turns (2 screenshots each), global batch {args.batch}, "
        f"{args.steps} steps per arm; {os.cpu_count()} CPU cores"
    )
    arms = [("1 process", 1, "ddp"), ("ddp x2", 2, "ddp"), ("fsdp x2", 2, "fsdp")]
    arms = [a for a in arms if a[0].split()[0] in ("1", *args.arms)]
    results: dict[str, Any] = {}
    base: dict[str, float] = {}
    base_loss: dict[int, float] = {}
    for name, n, strategy in arms:
        logged, wall = run_arm(name, spec, turns, cfg, root / name.replace(" ", "-"), n, strategy)
        row = {**summary(logged), "wall_s": wall, "processes": n}
        loss = {s: v["loss"] for s, v in logged}
        if n == 1:
            base, base_loss = row, loss
            extra = "(baseline)"
        else:
            row["scaling_efficiency"] = row["examples_per_s"] / (n * base["examples_per_s"])
            row["max_loss_diff"] = max(abs(loss[s] - base_loss[s]) for s in base_loss)
            extra = (
                f"scaling efficiency {row['scaling_efficiency']:.0%}, "
                f"max |loss - baseline's| {row['max_loss_diff']:.1e}"
            )
        results[name] = row
        say(
            f"{name}: {row['steps']} steps, {row['examples_per_s']:.2f} examples/s, "
            f"{row['tokens_per_s']:.0f} reply tokens/s (median step); "
            f"wall {wall:.1f} s with start-up; " + extra
        )
    return results


def gpu(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        say("gpu throughput: skipped (no CUDA device on this machine)")
        return {"skipped": "no CUDA device"}
    from scripts.gpu_check import main as gpu_main

    out = Path(tempfile.mkdtemp()) / "gpu.json"
    gpu_main(["--gradient-checkpointing", "--json", str(out)])
    return json.loads(out.read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (the suite's run)")
    ap.add_argument("--turns", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--gpu", action="store_true", help="also the GPU throughput check")
    ap.add_argument(
        "--arms", default="ddp,fsdp", help="2-process arms beside the baseline (--quick: ddp)"
    )
    ap.add_argument(
        "--results", type=Path, default=None, help="results file (default: bench/results/)"
    )
    args = ap.parse_args(argv)
    if args.quick:  # (fsdp x2 is checked against one process in tests/training)
        args.turns, args.batch, args.steps, args.arms = 12, 4, 3, "ddp"
    args.arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    return args


def main(argv: list[str] | None = None) -> None:
    global RESULTS
    args = parse_args(argv)
    RESULTS = Results("training", args)
    RESULTS.figures["cpu"] = cpu_scaling(args)
    if args.gpu:
        RESULTS.figures["gpu"] = gpu(args)
    RESULTS.write(args.results, args.quick)


if __name__ == "__main__":
    main()
