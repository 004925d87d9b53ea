"""Serving benchmark: rollout steps/s with the policy on vLLM vs the in-process ``hf`` policy.

Same tiny model (the tiny Idefics3 preset unless ``--model``), same bundled tasks, same engine
settings (concurrency, step budget, greedy decoding, screenshots + accessibility tree), real
Chromium on the bundled sites. Arms:

- ``hf``: :class:`rollouts.hf.HFPolicy` — the model in this process, batched across trajectories;
- ``vllm``: :class:`rollouts.policies.OpenAIPolicy` against vLLM (``.venv-vllm``), started by
  :class:`serving.supervisor.ModelServer` (its start-up time is printed, not counted);
- ``hf-http`` (``--arms``): the same policy against ``serve-model --engine hf``.

Every arm runs each task once; the random tiny model's actions are mostly invalid, so each
trajectory runs its whole step budget (``max_invalid`` = the budget) and all arms take the same
number of steps. Prints steps/s per arm and the ratio vllm / hf.

    python bench/serving.py [--quick] [--tasks 8] [--steps 4] [--concurrency 4]
                            [--vllm-url URL --model DIR]

``--vllm-url``: use a vLLM server that is already running (serving ``--model`` under the name
``tiny-idefics``, or ``--served-name``) instead of starting one; its start-up is not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

import httpx

from rollouts.engine import Engine, EngineConfig, Finished, make_jobs
from rollouts.env import EnvConfig, origin_of
from rollouts.hf import HFGenerator, HFPolicy, load_model
from rollouts.policies import OpenAIPolicy
from serving.supervisor import ModelServer, ServerSpec, free_port, vllm_python
from sites.server import SiteServer
from sites.tasks import generate, resolve_start_url
from stages.collect import bundled_grader

NAME = "tiny-idefics"


def say(text: str) -> None:
    print(text, flush=True)


async def run_arm(
    server: SiteServer, policy: Any, tasks: list[Any], concurrency: int, steps: int
) -> tuple[float, int, int]:
    """(seconds, trajectories, steps) of the engine over ``tasks`` with ``policy``."""
    done: list[Finished] = []

    async def sink(d: Finished) -> None:
        done.append(d)

    def resolve(t: Any) -> tuple[str, list[str]]:
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    cfg = EngineConfig(concurrency=concurrency, max_steps=steps, max_invalid=steps)
    async with httpx.AsyncClient() as client:
        engine = Engine(
            "bench-serving",
            policy,
            bundled_grader(server, client),
            sink,
            config=cfg,
            env_config=EnvConfig(action_timeout_s=8),
        )
        start = time.perf_counter()
        stats = await engine.run(make_jobs("bench-serving", tasks, 1, resolve))
        elapsed = time.perf_counter() - start
    if hasattr(policy, "aclose"):
        await policy.aclose()
    bad = [d.trajectory.status for d in done if d.trajectory.status in ("infra_error", "timeout")]
    if bad:
        raise RuntimeError(f"{len(bad)} trajectories ended in {sorted(set(bad))}: not comparable")
    return elapsed, len(done), stats.steps


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
    ap.add_argument("--quick", action="store_true", help="2 tasks x 3 steps, concurrency 2")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: tiny Idefics3)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--arms", default="hf,vllm", help="comma list of hf, vllm, hf-http")
    ap.add_argument("--vllm-url", default=None, help="a running vLLM server's /v1 URL")
    ap.add_argument("--served-name", default=NAME, help="the model's name at --vllm-url")
    args = ap.parse_args(argv)
    if args.vllm_url and not args.model:
        ap.error("--vllm-url needs --model: the folder the server serves (the hf arm loads it)")
    if args.quick:
        args.tasks, args.steps, args.concurrency = 2, 3, 2
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - {"hf", "vllm", "hf-http"}
    if unknown:
        ap.error(f"unknown arms {sorted(unknown)}")
    if "vllm" in arms and vllm_python() is None and not args.vllm_url:
        ap.error("the vllm arm needs .venv-vllm: run `make vllm`")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from training.models import build_tiny_idefics

            model = str(build_tiny_idefics(Path(tmp) / NAME))
        tasks = generate(args.tasks, seed=21)
        say(
            f"serving bench: {len(tasks)} tasks x {args.steps} steps, concurrency "
            f"{args.concurrency}, greedy, max_tokens {args.max_tokens}, model {model}; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        rates: dict[str, float] = {}
        with SiteServer(seed=0) as sites:
            for arm in arms:
                rates[arm] = run_one(arm, model, sites, tasks, args, Path(tmp))
        if "hf" in rates and "vllm" in rates:
            say(f"ratio vllm/hf: {rates['vllm'] / rates['hf']:.2f}x steps/s")
        return rates


def run_one(
    arm: str, model: str, sites: SiteServer, tasks: list[Any], args: Any, tmp: Path
) -> float:
    """Steps/s of one arm (its server started first, outside the timing)."""
    server = None
    if arm == "hf":
        m, proc = load_model(model)
        policy: Any = HFPolicy(
            generator=HFGenerator(m, proc, max_batch=args.concurrency),
            max_new_tokens=args.max_tokens,
        )
    elif arm == "vllm" and args.vllm_url:
        say(f"  vllm: the running server at {args.vllm_url} (start-up not measured)")
        policy = OpenAIPolicy(
            args.vllm_url, args.served_name, max_tokens=args.max_tokens, timeout_s=300, retries=1
        )
    else:
        engine = "vllm" if arm == "vllm" else "hf"
        spec = ServerSpec(engine, model, port=free_port(), name=NAME, enforce_eager=args.eager)
        server = ModelServer(spec, log=tmp / f"{arm}.log").start(timeout_s=900)
        say(f"  {arm}: server healthy in {server.started_s:.1f} s")
        policy = OpenAIPolicy(
            server.base_url, NAME, max_tokens=args.max_tokens, timeout_s=300, retries=1
        )
    try:
        elapsed, n, steps = asyncio.run(run_arm(sites, policy, tasks, args.concurrency, args.steps))
    finally:
        if server is not None:
            server.stop()
    rate = steps / elapsed
    say(f"  {arm}: {n} trajectories, {steps} steps in {elapsed:.1f} s = {rate:.4f} steps/s")
    return rate


if __name__ == "__main__":
    from bench.results import run_main

    run_main("serving", main)
