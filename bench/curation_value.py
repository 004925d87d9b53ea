"""Curation value benchmark: does filtering the data make a better policy, when the noise is
structured? On 2 cores.

Random slips of a scripted expert (the learning bench's ``--noise 0.1``) barely hurt a policy
trained on them: each wrong action is rare at its state, so the argmax learns the right one and
the curated and unfiltered SFT checkpoints come out level. Real demonstrations err in habits: the
same wrong move at the same kind of state. This bench makes that noise and measures each arm:

1. data: the scripted expert with ``--noise-kind habit`` on ``--collect`` ``train`` tasks: in a
   ``--noise`` share of episodes the task template's one wrong habit (``rollouts.policies.habit``:
   skip a given step, or click the neighbouring element of the same role there, then carry on),
   graded by the programmatic judge;
2. interventions (InT): for each failed trajectory, its first error found by page-state
   replay, the expert teacher's correction there (the reference's next action from the aligned
   position), verified by replaying prefix + correction + the expert's continuation
   (``stages.intervene``; ``--interventions N`` caps how many trajectories, 0: none);
3. arms, datasets of the SAME trajectories: ``unfiltered`` (every graded trajectory),
   ``success`` (the filtered-BC recipe: judged successes, invalid steps and loops dropped,
   deduplicated), ``success+interventions`` (that, plus one example per verified
   intervention: the failed prefix as the prompt, the correction as the target) and
   ``prefixes`` (a step-level filter: every success whole, and each failure's steps before the
   first error the interventions located, ``before_first_error``; a failure without one is
   dropped);
4. training: the ranker by SFT on each arm for the SAME number of gradient steps (``--steps``
   of ``--batch``: a smaller dataset gets more epochs), so an arm wins on its data, not on more
   updates;
5. evaluation: each checkpoint greedy on the same ``--eval-n`` ``test`` tasks (deterministic
   sites, so paired); the pairs of :data:`PAIRS`, overall (template-clustered bootstrap
   interval, exact McNemar) and per template, beside each template's failed share of the
   training trajectories (the habits' footprint).

Everything is the product's own code path (collect / judge / curate / train / evaluate), in one
process with one sites server and one Chromium, into a fresh warehouse; a results file as the
other benches write. The aim (issue 32): success-filtered beats unfiltered with the paired
interval excluding 0, under 20 minutes.

    python bench/curation_value.py [--quick] [--noise 0.4] [--collect 360] [--steps 400]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import learning  # (after the path and offline settings)

FULL = dict(
    suite_version="2",
    tasks=2400,
    collect=360,
    noise=0.4,
    interventions=360,
    steps=400,
    batch=32,
    eval_n=300,
    eval_max_steps=30,
)
QUICK = dict(FULL, tasks=160, collect=12, interventions=2, steps=20, batch=8, eval_n=3)
QUICK["eval_max_steps"] = 8

WITH_INTERVENTIONS = learning.CURATED.replace("bench-curated", "value-success-interventions")
WITH_INTERVENTIONS = WITH_INTERVENTIONS.replace(
    "output:", "include: {{interventions: true}}\noutput:"
).replace("(filtered BC)", "(filtered BC) and verified interventions on the failures")
PREFIXES = """
name: value-prefixes
description: "Every success whole, every failure up to its first error (a step-level filter)."
sources: {{splits: [train], runs: [{run}]}}
filters:
  - before_first_error: {{}}
  - drop_invalid_steps: {{}}
  - drop_loops: {{max_repeats: 2}}
  - dedup_trajectories: {{}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
gates: {{success_rate: [0.0, 1.0]}}
"""
ARMS = {
    "unfiltered": learning.UNFILTERED.replace("bench-unfiltered", "value-unfiltered"),
    "success": learning.CURATED.replace("bench-curated", "value-success"),
    "success+interventions": WITH_INTERVENTIONS,
    "prefixes": PREFIXES,
}
#: The paired comparisons reported, (A, B): B − A.
PAIRS = [
    ("unfiltered", "success"),
    ("success", "success+interventions"),
    ("unfiltered", "success+interventions"),
    ("unfiltered", "prefixes"),
]

say = learning.say


async def intervene(b: Any, run: str) -> None:
    """Verified interventions of the expert teacher on the run's failed trajectories."""
    from stages.intervene import InterveneConfig, run_intervene_async

    if not b.a.interventions:
        say("interventions: none asked for (--interventions 0)")
        return
    t0 = time.perf_counter()
    cfg = InterveneConfig(
        teacher="expert",
        run=run,
        max_trajectories=b.a.interventions,
        concurrency=4,
        action_timeout_s=1.5,
    )
    res = await run_intervene_async(b.wh, cfg, server=b.server, browser=b.browser)
    b.timed("intervene", t0)
    say(
        f"interventions (expert teacher): {res.selected} failed trajectories, "
        f"{res.intervened} intervened, {res.verified} verified, {res.not_verified} not, "
        f"{res.no_error_found} without an error found, {res.errors} errors"
    )


def by_template(b: Any, run: str) -> dict[str, dict[str, int]]:
    """Per template of the run's trajectories: how many, and how many succeeded (the failures
    are mostly the habit's: the expert makes no other mistake)."""
    df = b.wh.sql("SELECT task_id, status FROM trajectories WHERE run_id = ?", [run])
    out: dict[str, dict[str, int]] = {}
    for task_id, status in df.iter_rows():
        template = task_id.split("/")[1] if task_id.count("/") >= 2 else task_id
        row = out.setdefault(template, {"n": 0, "success": 0})
        row["n"] += 1
        row["success"] += status == "success"
    return out


async def run_all(b: Any, home: Path) -> None:
    learning.generate(b)
    run = await learning.expert_run(
        b, "value-habit-expert", n=b.a.collect, noise=b.a.noise, noise_kind="habit"
    )
    train = by_template(b, run)
    await intervene(b, run)
    data = {
        arm: learning.build(b, text.format(run=json.dumps(run)), home / "datasets")
        for arm, text in ARMS.items()
    }
    checkpoints = {
        arm: learning.sft(b, ds, arm, max_steps=b.a.steps).checkpoint for arm, ds in data.items()
    }
    say(f"evaluation (ranker, greedy, {b.a.eval_n} test tasks, max {b.a.eval_max_steps} steps):")
    for arm, checkpoint in checkpoints.items():
        await learning.evaluate(b, arm, checkpoint, "test")
    report(b, train)


def report(b: Any, train: dict[str, dict[str, int]]) -> None:
    """Each pair of :data:`PAIRS`, paired on the same tasks, overall and per template (with the
    template's failed share of the training trajectories: the habits' footprint)."""
    from training.evaluate import compare_evaluations

    say(
        "differences (B - A, paired on the same test tasks: 95% bootstrap interval resampling "
        "templates, exact McNemar p):"
    )
    for a, c in PAIRS:
        d = compare_evaluations(b.wh, b.evals[(a, "test")]["row"], b.evals[(c, "test")]["row"])
        if d["method"] != "paired":
            raise SystemExit(f"{c} vs {a}: not paired ({d.get('unpaired_because')})")
        p = d["mcnemar_p"]
        say(
            f"  {c} - {a}: {d['diff']:+.1%} [{d['ci_low']:+.1%}, {d['ci_high']:+.1%}] paired on "
            f"{d['n_pairs']} tasks ({d['clusters']} templates), only A {d['a_only']} / only B "
            f"{d['b_only']}, McNemar p " + (f"{p:.3g}" if p is not None else "n/a")
        )
        if learning.RESULTS is not None:
            keep = ("diff", "ci_low", "ci_high", "n_pairs", "a_only", "b_only", "mcnemar_p")
            figures = learning.RESULTS.figures.setdefault("differences", {})
            figures[f"{c} - {a}"] = {
                **{k: d.get(k) for k in keep},
                "by_template": {str(g["template"]): g for g in d["by_template"]},
            }
    per_template(b, train)


def per_template(b: Any, train: dict[str, dict[str, int]]) -> None:
    """Solved per template and arm on the same test tasks, beside the training failures."""
    solved: dict[str, dict[str, int]] = {}
    n: dict[str, int] = {}
    for arm in ARMS:
        for template, (k, m) in learning.solved_by_template(b, arm, "test").items():
            solved.setdefault(template, {})[arm] = k
            n[template] = m
    say(f"per template (test solved: {' / '.join(ARMS)} of n; train: failed of trajectories):")
    for template in sorted(solved):
        h = train.get(template, {"n": 0, "success": 0})
        counts = " / ".join(f"{solved[template].get(arm, 0):>3}" for arm in ARMS)
        failed = h["n"] - h["success"]
        say(f"  {template:<24} {counts} of {n.get(template, 0):<4} train {failed}/{h['n']} failed")
    if learning.RESULTS is not None:
        learning.RESULTS.figures["per_template"] = {
            t: {"test_n": n.get(t, 0), "test_solved": solved[t], "train": train.get(t)}
            for t in solved
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return learning.sized_args(__doc__, FULL, QUICK, argv)


def main() -> None:
    learning.run_bench("curation_value", parse_args(), run_all)


if __name__ == "__main__":
    main()
