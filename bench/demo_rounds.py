"""Does ``make demo``'s second round beat its first? The demo (``stages/presets/demo.yaml``) run
once per seed in a fresh home, each round evaluated greedily on the same held-out ``test`` tasks,
so round 2 against round 1 is paired: per seed, solved of n in each round, the tasks lost and
gained, and the demo's wall time. The aims (issue 50): round 2 >= round 1 on every seed, each
demo under 5 minutes.

    python bench/demo_rounds.py                   # seeds 0 1 2 at the demo's size
    python bench/demo_rounds.py --seeds 3 4       # more seeds
    python bench/demo_rounds.py --quick           # the suite's size (a tiny flywheel, one seed)

Each seed's demo runs in a fresh Python process (its own sites server and Chromium), as
``make demo`` does, and its wall time is that process's, imports included; the results
file (``bench/results/demo_rounds-*.json``) holds every line printed and the figures per seed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.results import capture  # (after the path and offline settings)

DEMO_LIMIT_S = 300
#: ``--quick``: a tiny flywheel (the flow tests' size) on one seed; the aims are printed, not met.
QUICK: dict[str, Any] = dict(
    bundled_tasks=60,
    expert={"n_tasks": 4, "noise": 0.1},
    rollout={"n_tasks": 3, "samples": 2},
    prm_states=1,
    prm_k=2,
    interventions=2,
    epochs=2,
    later_epochs=1,
    eval={"n_tasks": 3, "max_steps": 8},
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (quick: 0)")
    p.add_argument("--quick", action="store_true", help="the suite's size")
    p.add_argument("--results", type=Path, default=None, help="where the results file goes")
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    return args


def one_seed(seed: int, quick: bool) -> dict[str, Any]:
    """The demo on ``seed`` in a fresh process and a fresh home: its rounds' held-out figures
    and the process's wall time."""
    with tempfile.TemporaryDirectory(prefix=f"demo-rounds-{seed}-") as tmp:
        out = Path(tmp) / "rounds.json"
        argv = [sys.executable, __file__, "--seeds", str(seed), "--child", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(argv + ["--quick"] * quick, env={**os.environ, "WEBLOOP_HOME": tmp})
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"the demo on seed {seed} failed (exit {proc.returncode}): see above")
        return {**json.loads(out.read_text()), "wall_s": wall}


def child(seed: int, quick: bool, out: Path) -> None:
    """One seed's demo in this process (``--child``): its rounds written to ``out``."""
    from flows.demo import demo_config, run_demo

    cfg = demo_config(seed=seed, **(QUICK if quick else {}))
    result = run_demo(cfg, home=os.environ["WEBLOOP_HOME"])
    out.write_text(json.dumps({"seed": seed, "flywheel_id": cfg.flywheel_id, **rounds(result)}))


def rounds(out: Any) -> dict[str, Any]:
    """Each round's held-out solved of n, and the tasks it lost and gained against the one
    before (paired on the same tasks); ``out``: the flywheel's ``FlywheelResult``."""
    per_round = []
    for r in out.rounds:
        after, delta = r.after, r.delta or {}
        per_round.append(
            {
                "round": r.round,
                "solved": after["n_success"],
                "n": after["n"],
                "lost": delta.get("a_only"),
                "gained": delta.get("b_only"),
            }
        )
    return {"rounds": per_round}


def seed_line(r: dict[str, Any]) -> str:
    parts = [f"round {x['round']} {x['solved']}/{x['n']}" for x in r["rounds"]]
    last = r["rounds"][-1]
    change = (
        f"round {last['round']} against round {last['round'] - 1}: "
        f"{last['lost']} lost, {last['gained']} gained"
        if len(r["rounds"]) > 1
        else "one round"
    )
    return f"seed {r['seed']}: {' -> '.join(parts)} ({change}); {r['wall_s']:.0f} s"


def aims(per_seed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Round 2 >= round 1 on every seed (paired on the same tasks); every demo < 5 minutes."""
    not_worse = [r["rounds"][-1]["solved"] >= r["rounds"][0]["solved"] for r in per_seed]
    walls = [r["wall_s"] for r in per_seed]
    return {
        "last round >= round 1 on every seed": {
            "met": all(not_worse) and len(per_seed[0]["rounds"]) > 1,
            "figure": f"{sum(not_worse)} of {len(per_seed)} seeds",
        },
        "every demo < 5 minutes": {
            "met": max(walls) < DEMO_LIMIT_S,
            "figure": f"{min(walls):.0f}-{max(walls):.0f} s",
        },
    }


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child(args.seeds[0], args.quick, args.child)
        return
    with capture("demo_rounds", args) as rec:
        per_seed = []
        for seed in args.seeds:
            print(f"demo seed {seed}: running ...", flush=True)
            r = one_seed(seed, args.quick)
            per_seed.append(r)
            print(seed_line(r), flush=True)
        checks = aims(per_seed)
        print("aims:")
        for name, c in checks.items():
            print(f"  {'met   ' if c['met'] else 'MISSED'} {name}: {c['figure']}")
        rec.figures.update({"seeds": per_seed, "aims": checks})


if __name__ == "__main__":
    main()
