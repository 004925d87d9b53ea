"""Bundled-sites benchmark: scripted-expert success and server page latency under load.

Prints, in one run:
  * the expert's success rate (programmatic checker) over N generated tasks (default 500),
    run in real Chromium with 16 concurrent browser contexts;
  * the sites server's page latency (median, p95) measured server-side over that run, for all
    HTML pages and without the fare search (which is deliberately slow: ``slow_s``).

    python bench/sites.py [--n 500] [--concurrency 16] [--seed 0] [--quick]

``--quick`` (8 tasks, 4 contexts) is the size the test suite runs, so a broken benchmark fails CI.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[1]))

from sites.common import SECRET_HEADER
from sites.server import SITES, SiteServer
from sites.tasks import generate
from stages.bundled import run_expert


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def page_times(server: SiteServer) -> list[tuple[str, float]]:
    out = []
    for site in SITES:
        r = httpx.get(
            f"{server.url(site)}/__webloop/metrics",
            headers={SECRET_HEADER: server.secret},
            timeout=30,
        )
        out += [(f"{site}{p}", t) for p, t in r.json()["pages"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
    ap.add_argument("--quick", action="store_true", help="8 tasks, 4 contexts (the CI size)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.concurrency = 8, 4
    tasks = generate(args.n, args.seed)
    print(f"{len(tasks)} tasks, {args.concurrency} concurrent browser contexts …", flush=True)
    done: list = []
    start = time.perf_counter()

    def progress(res) -> None:
        done.append(res)
        if len(done) % 50 == 0 or len(done) == len(tasks):
            ok = sum(r.verdict.success for r in done)
            rate = len(done) / (time.perf_counter() - start)
            print(
                f"  {len(done):4d}/{len(tasks)}  success {ok / len(done):.1%}  {rate:.1f} tasks/s",
                flush=True,
            )

    with SiteServer(seed=0, mode="process") as server:
        results = asyncio.run(
            run_expert(tasks, server, concurrency=args.concurrency, progress=progress)
        )
        times = page_times(server)
    elapsed = time.perf_counter() - start
    ok = sum(r.verdict.success for r in results)
    steps = sum(len(t.reference or []) for t in tasks)
    all_t = [t for _, t in times]
    fast_t = [t for p, t in times if not p.startswith("travel/flights")]
    print()
    print(
        f"expert success: {ok}/{len(results)} = {ok / len(results):.2%} "
        f"({elapsed:.0f} s, {steps / elapsed:.1f} actions/s)"
    )
    failures = Counter(r.task_id.split("/")[1] for r in results if not r.verdict.success)
    if failures:
        print(f"failures by template: {dict(failures)}")
    print(
        f"page latency, all {len(all_t)} HTML responses: median "
        f"{statistics.median(all_t) * 1000:.1f} ms, p95 {percentile(all_t, 0.95) * 1000:.1f} ms"
    )
    print(
        f"page latency without the deliberately slow fare search ({len(fast_t)}): median "
        f"{statistics.median(fast_t) * 1000:.1f} ms, p95 "
        f"{percentile(fast_t, 0.95) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    from bench.results import run_main

    run_main("sites", main)
