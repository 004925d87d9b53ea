"""Held-out site benchmark: a few-shot curve on the travel site (the ``ood`` split), on 2 cores.

The learning bench's policies never see travel and solve none of it. This bench asks what a few
demonstrations of the new site buy, and whether what fails is the site or the policy's habits:

1. tasks: ``--tasks`` bundled tasks (travel is the ``ood`` split); the ``ood`` tasks in a seeded
   order: the first ``max(--shots)`` are the demonstration pool, the next ``--eval-n`` the
   held-out evaluation tasks (never demonstrated);
2. demonstrations: the scripted expert (no mistakes) on ``--train`` ``train`` tasks of the
   training sites, and on the first K travel tasks for each K of ``--shots`` (0, 5, 20); the
   expert also solves the held-out travel tasks once, for next-action accuracy;
3. per K: a curated dataset (judged successes of the training-site demonstrations plus the first
   K travel ones), ranker SFT on it (the learning bench's settings);
4. per K, on the held-out travel tasks: closed-loop success (greedy, Wilson and template-
   clustered intervals), the share of the checker's criteria met (progress), and next-action
   accuracy (the policy's top choice against the expert's action at the expert's own states);
   K vs 0 paired on the same tasks.

Everything is the product's own code path, in one process with one sites server and one
Chromium, into a fresh warehouse; a results file as the other benches write.

    python bench/ood.py [--quick] [--shots 0,5,20] [--eval-n 100] [--seed 0] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import learning  # (after the path and offline settings)

# 160 training-site demonstrations and 10 epochs (240 and 12 before) for a run of about 21 minutes
# on 2 cores; the longest travel reference solution is 15 steps, so 24 steps leave a policy room
# to recover without failures running on to 30.
# ``--seed``: which travel tasks are demonstrated and held out, which training-site tasks are
# demonstrated, and SFT's initialisation and data order (runs of several seeds give the spread).
FULL = dict(tasks=2400, train=160, shots="0,5,20", eval_n=100, eval_max_steps=24, epochs=10, seed=0)
QUICK = dict(FULL, tasks=400, train=8, shots="0,1", eval_n=2, eval_max_steps=6, epochs=2)

DEMOS = """
name: ood-{k}-shot
description: "Expert demonstrations: the training sites, and {k} of the held-out travel site."
sources: {{splits: [train, ood], runs: {runs}}}
filters:
  - verdict: {{judges: [programmatic], verdict: success, min_agreement: 1.0}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
gates: {{success_rate: [0.0, 1.0]}}
"""
HELDOUT = """
name: ood-heldout-expert
description: "The expert on the held-out travel tasks (next-action accuracy; never trained on)."
sources: {{splits: [ood], runs: [{run}]}}
filters:
  - verdict: {{judges: [programmatic], verdict: success, min_agreement: 1.0}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
gates: {{success_rate: [0.0, 1.0]}}
"""

say = learning.say


def ood_order(tasks: list[Any], seed: int = 0) -> list[str]:
    """The ``ood`` task ids in a seeded order (demonstrations first, then evaluation)."""
    ids = sorted(t.task_id for t in tasks if t.split == "ood")
    random.Random(seed).shuffle(ids)
    return ids


class HeldoutAccuracy:
    """Next-action accuracy at the expert's held-out states: (top choices equal to the expert's
    action, expert turns) of a checkpoint over ``ds``'s SFT rows. The frozen encoder's work on
    those states does not depend on the checkpoint: it is done once, in batches, and every
    checkpoint's scorer reads it."""

    def __init__(self, b: Any, ds: Any) -> None:
        from training.data import find_dataset, sft_turns

        self.turns = sft_turns(find_dataset(b.wh, ds.dataset_id).export_path, ("ood",))
        self.reader: Any = None

    def __call__(self, checkpoint: str) -> tuple[int, int]:
        from rollouts.ranker import RankerModel
        from training.ranker import RankerTrainable

        if self.reader is None:
            self.reader = RankerTrainable.load(checkpoint)
            self.reader.prepare(self.turns)
        else:
            self.reader.module = RankerModel.from_pretrained(checkpoint)
        self.reader.train(False)
        hits = 0
        for t in self.turns:
            best, target = self.reader.greedy_and_target(t)
            hits += target is not None and best == target
        return hits, len(self.turns)


def progress(b: Any, evaluation: dict[str, Any]) -> float:
    """The mean share of the checker's criteria met over the evaluation's checked trajectories
    (the collector records them in ``meta.criteria``)."""
    df = b.wh.sql(
        "SELECT meta FROM trajectories WHERE run_id = ? AND status IN ('success', 'failure')",
        [evaluation["row"]["run_id"]],
    )
    shares = []
    for raw in df["meta"].to_list():
        meta = json.loads(raw) if isinstance(raw, str) else raw or {}
        crit = [c for c in meta.get("criteria") or [] if isinstance(c, dict)]
        if crit:
            shares.append(sum(bool(c.get("passed")) for c in crit) / len(crit))
    return sum(shares) / len(shares) if shares else float("nan")


async def run_all(b: Any, home: Path) -> None:
    from sites.tasks import generate
    from warehouse.tasks import put_tasks

    a = b.a
    tasks = generate(a.tasks, seed=0)
    put_tasks(b.wh, tasks)
    shots = sorted({int(k) for k in a.shots.split(",")})
    order = ood_order(tasks, a.seed)
    pool, held_out = order[: max(shots)], order[max(shots) : max(shots) + a.eval_n]
    say(
        f"tasks: {len(tasks)}; ood (travel) {len(order)}: demonstration pool {len(pool)}, "
        f"held out {len(held_out)}"
    )
    train_run = await learning.expert_run(
        b, "ood-train-demos", split="train", n=a.train, collect={"seed": a.seed}
    )
    heldout_run = await learning.expert_run(
        b, "ood-heldout-expert", split="ood", n=len(held_out), task_ids=tuple(held_out)
    )
    heldout = learning.build(b, HELDOUT.format(run=json.dumps(heldout_run)), home / "datasets")
    accuracy = HeldoutAccuracy(b, heldout)
    results: dict[int, dict[str, Any]] = {}
    for k in shots:
        runs = [train_run]
        if k:
            ids = tuple(pool[:k])
            runs.append(
                await learning.expert_run(b, f"ood-travel-{k}", split="ood", n=k, task_ids=ids)
            )
        ds = learning.build(b, DEMOS.format(k=k, runs=json.dumps(runs)), home / "datasets")
        res = learning.sft(b, ds, f"{k}-shot", splits=("train", "ood"), seed=a.seed)
        t0 = time.perf_counter()
        hits, n = accuracy(res.checkpoint)
        b.timed("next-action accuracy", t0)
        ev = await learning.evaluate(b, f"{k}-shot", res.checkpoint, "ood", tuple(held_out))
        results[k] = {"hits": hits, "turns": n, "progress": progress(b, ev)}
    report(b, shots, results)


def report(b: Any, shots: list[int], results: dict[int, dict[str, Any]]) -> None:
    from training.evaluate import compare_evaluations

    say("few-shot curve on the held-out travel site (the same held-out tasks for every K):")
    zero = b.evals[(f"{shots[0]}-shot", "ood")]
    for k in shots:
        e, r = b.evals[(f"{k}-shot", "ood")], results[k]
        acc = r["hits"] / r["turns"] if r["turns"] else float("nan")
        line = (
            f"  {k:>3} demonstrations: success {e['n_success']}/{e['n']} {e['rate']:.1%} "
            f"[{e['ci_low']:.1%}, {e['ci_high']:.1%}], criteria met {r['progress']:.1%}, "
            f"next-action accuracy {r['hits']}/{r['turns']} {acc:.1%}"
        )
        if k != shots[0]:
            d = compare_evaluations(b.wh, zero["row"], e["row"])
            line += f"; vs {shots[0]}: {d['diff']:+.1%} [{d['ci_low']:+.1%}, {d['ci_high']:+.1%}]"
            line += f" ({d['method']}"
            line += f", McNemar p {d['mcnemar_p']:.3g})" if d.get("mcnemar_p") is not None else ")"
            if learning.RESULTS is not None:
                keep = ("diff", "ci_low", "ci_high", "n_pairs", "a_only", "b_only", "mcnemar_p")
                learning.RESULTS.figures.setdefault("differences", {})[
                    f"ood/{k}-shot - {shots[0]}-shot"
                ] = {key: d.get(key) for key in keep}
        say(line)
        if learning.RESULTS is not None:
            learning.RESULTS.figures.setdefault("shots", {})[str(k)] = {
                "n": e["n"],
                "n_success": e["n_success"],
                "rate": e["rate"],
                "ci_low": e["ci_low"],
                "ci_high": e["ci_high"],
                "criteria_met": r["progress"],
                "next_action_accuracy": acc,
            }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = learning.sized_args(__doc__, FULL, QUICK, argv)
    args.batch = 32 if not args.quick else 16  # the learning bench's SFT settings
    return args


def main() -> None:
    learning.run_bench("ood", parse_args(), run_all)


if __name__ == "__main__":
    main()
