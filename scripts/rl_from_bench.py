"""RL variants from a finished learning bench: the same SFT start, the same evaluation.

``bench/learning.py --home DIR`` leaves a warehouse with the curated SFT checkpoint and its
dataset. This runs one more RL configuration from that checkpoint (the bench's own ``rl`` and
``evaluate`` functions, the same sites seed and Chromium), evaluates the result on the bench's
``test`` tasks (and ``ood`` with ``--eval-ood``) and prints the difference to the SFT
checkpoint's evaluation stored by the bench, with its 95% interval. Everything it writes goes
into the same warehouse, under run ids named by the configuration (a re-run resumes).

    python scripts/rl_from_bench.py --home DIR --rl-estimator step_awr [--rl-iterations 2] ...

Every ``--rl-*`` and ``--prm-*`` option of the bench is accepted (its defaults as there).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import learning  # bench/learning.py: its stages and its defaults


def sft_start(wh) -> tuple[str, str, str]:
    """The bench's curated SFT checkpoint folder, its dataset id and its ``test`` evaluation."""
    row = wh.sql(
        "SELECT c.path, r.dataset_id, c.checkpoint_id FROM checkpoints c "
        "JOIN training_runs r USING (training_run_id) JOIN datasets d USING (dataset_id) "
        "WHERE r.stage = 'sft' AND d.name = 'bench-curated' ORDER BY c.step DESC LIMIT 1"
    )
    if row.is_empty():
        raise SystemExit("no curated SFT checkpoint in this warehouse: run bench/learning.py first")
    path, dataset_id, checkpoint_id = row.row(0)
    ev = wh.sql(
        "SELECT evaluation_id FROM evaluations WHERE checkpoint_id = ? AND split = 'test' "
        "ORDER BY created_at LIMIT 1",
        [checkpoint_id],
    )
    if ev.is_empty():
        raise SystemExit(f"the SFT checkpoint {checkpoint_id} has no test evaluation here")
    return path, dataset_id, ev.item()


async def main_async(args: argparse.Namespace) -> None:
    from rollouts.browser import launch
    from sites.server import SiteServer
    from training.evaluate import compare, find_evaluation
    from warehouse import Warehouse, WarehouseConfig

    server = SiteServer(seed=0, mode="process").start()
    from playwright.async_api import async_playwright

    try:
        async with async_playwright() as pw:
            browser = await launch(pw)
            cfg = WarehouseConfig.from_env(home=args.home, warehouse="")
            with Warehouse.open(cfg) as wh:
                b = learning.Bench(args, wh, server, browser)
                start, anchor, sft_eval = sft_start(wh)
                learning.say(f"RL from {start} (anchor {anchor}): {args.rl_estimator}")
                res = await learning.rl(b, start, anchor)
                ev = await learning.evaluate(b, "rl", res.checkpoint, "test")
                if args.eval_ood:
                    await learning.evaluate(b, "rl", res.checkpoint, "ood")
                d = compare(find_evaluation(wh, sft_eval), find_evaluation(wh, ev.evaluation_id))
                learning.say(
                    f"  test  rl - sft curated: {d['diff']:+.1%} [{d['ci_low']:+.1%}, "
                    f"{d['ci_high']:+.1%}]" + ("  separated" if d["separated"] else "")
                )
            await browser.close()
    finally:
        server.stop()
    times = ", ".join(f"{k} {v:.0f} s" for k, v in b.times.items())
    learning.say(f"({times})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, required=True, help="the learning bench's home")
    p.add_argument("--eval-ood", action="store_true", help="also evaluate on the ood split")
    args, rest = p.parse_known_args()
    bench = learning.parse_args(rest)
    for k, v in vars(bench).items():
        if k not in ("home", "eval_ood"):
            setattr(args, k, v)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
