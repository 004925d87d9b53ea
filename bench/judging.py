"""Judging benchmark. Prints, in one run, for the rubric VLM judge against a local
OpenAI-compatible server that answers every request after a FIXED latency:

1. model calls and image inputs per trajectory (``model`` selection: key points + one relevance
   call per screenshot + the verdict = N + 2; ``heuristic`` selection: fewer), and
2. trajectories judged per second at concurrency 1 and 16, and their ratio (what bounded
   concurrency buys when the judge model, not webloop, is the bottleneck).

Trajectories are synthetic (distinct PNG screenshots in a temporary warehouse), so the figures
measure the judge pipeline, not a model.

    python bench/judging.py [--trajectories 64] [--steps 8] [--latency 0.2] [--k 4]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).parents[1]))

from bench.childserver import ChildServer
from judging.base import backlog, judge_all, make_judge
from warehouse import Warehouse, WarehouseConfig
from warehouse.records import Step, Task, Trajectory


class FixedLatencyJudgeModel:
    """Replies like a judge model would (key points, relevance scores, a verdict), each after
    exactly ``latency`` seconds; counts requests and images (``GET /stats``). Runs in its own
    process, like a real model server, so it does not share the judge's interpreter."""

    def __init__(self, latency: float) -> None:
        self.latency, self.requests, self.images = latency, 0, 0
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/stats", self.stats),
            ]
        )

    async def stats(self, request: Request) -> JSONResponse:
        return JSONResponse({"requests": self.requests, "images": self.images})

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        content = body["messages"][-1]["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = "".join(p.get("text", "") for p in parts if p.get("type") == "text")
        self.requests += 1
        self.images += sum(1 for p in parts if p.get("type") == "image_url")
        if "List the key points" in text:
            reply = "1. the right item\n2. the right quantity\n3. the order is placed"
        elif "How much evidence" in text:
            step = int(re.search(r"\(step (\d+)\)", text).group(1))
            reply = f"Score: {1 + step % 5}"
        else:
            reply = json.dumps(
                {
                    "criteria": [{"key_point": "the right item", "passed": True, "reason": "ok"}],
                    "verdict": "success",
                    "rationale": "fixed",
                }
            )
        await asyncio.sleep(self.latency)
        return JSONResponse(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}],
            }
        )


class ModelProcess(ChildServer):
    """The fixed-latency model server in a child process; ``counts()`` reads its counters."""

    def __init__(self, latency: float) -> None:
        super().__init__(__file__, "--latency", str(latency))

    def counts(self) -> tuple[int, int]:
        body = self.stats()
        return body["requests"], body["images"]


def png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (320, 200), ((i * 37) % 256, (i * 11) % 256, 90)).save(buf, format="PNG")
    return buf.getvalue()


def populate(wh: Warehouse, n: int, steps: int) -> None:
    tasks, trajs, rows = [], [], []
    for t in range(n):
        tid = f"bench/{t}"
        tasks.append(Task(task_id=tid, suite="bench", instruction=f"Buy item {t}", start_url="u"))
        for i in range(steps):
            rows.append(
                Step(
                    traj_id=f"traj-{t}",
                    step_idx=i,
                    url=f"https://shop.example/{i // 2}",
                    title=f"page {i}",
                    screenshot_hash=wh.blobs.put(png(t * steps + i)).hash,
                    action_text=f"click({10 * i}, 20)",
                )
            )
        trajs.append(
            Trajectory(
                traj_id=f"traj-{t}",
                run_id="bench",
                task_id=tid,
                policy="p",
                status="finished",
                n_steps=steps,
                answer="bought",
            )
        )
    wh.write(tasks)
    wh.write_trajectories(trajs, rows)


def measure(wh, model, selection: str, k: int, concurrency: int) -> dict:
    judge = make_judge(
        "rubric_vlm", base_url=model.url, model=f"bench-c{concurrency}", k=k, selection=selection
    )
    ids = backlog(wh, judge)
    before_req, before_img = model.counts()
    start = time.perf_counter()
    summary = asyncio.run(judge_all(wh, judge, ids, concurrency=concurrency))
    wall = time.perf_counter() - start
    assert summary.errors == 0, summary.error_examples
    n = summary.judged
    after_req, after_img = model.counts()
    return {
        "judged": n,
        "calls": (after_req - before_req) / n,
        "images": (after_img - before_img) / n,
        "per_s": n / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
    ap.add_argument("--quick", action="store_true", help="8 x 6 steps, 20 ms (the CI size)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child: serve on port
    args = ap.parse_args()
    if args.quick:
        args.trajectories, args.steps, args.latency = 8, 6, 0.02
    if args.serve:
        app = FixedLatencyJudgeModel(args.latency).app
        uvicorn.run(app, host="127.0.0.1", port=args.serve, log_level="warning")
        return
    n_shots = args.steps  # synthetic trajectories have no final screenshot
    with (
        tempfile.TemporaryDirectory() as tmp,
        ModelProcess(args.latency) as model,
        Warehouse.open(WarehouseConfig.from_env(home=Path(tmp))) as wh,
    ):
        populate(wh, args.trajectories, args.steps)
        print(
            f"rubric_vlm judge, {args.trajectories} trajectories x {n_shots} screenshots, "
            f"fixed model latency {args.latency * 1000:.0f} ms, image cap k={args.k}"
        )
        for selection in ("model", "heuristic"):  # each run has its own judge version/model
            rates = {}
            for c in (1, 16):
                m = measure(wh, model, selection, args.k, c)
                rates[c] = m["per_s"]
                print(
                    f"  selection={selection:9s} concurrency {c:2d}: "
                    f"{m['calls']:.1f} model calls/trajectory (N+2 = {n_shots + 2}), "
                    f"{m['images']:.1f} image inputs/trajectory, "
                    f"{m['per_s']:.2f} trajectories/s"
                )
            ratio = rates[16] / rates[1]
            print(f"  selection={selection:9s} concurrency 16 vs 1: {ratio:.1f}x")


if __name__ == "__main__":
    from bench.results import run_main

    run_main("judging", main, children=("--serve",))
