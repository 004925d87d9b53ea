"""Learning benchmark: does the flywheel make an agent better, on 2 cores? Prints, in one run:

1. data: a noisy scripted expert (``--noise``: wrong elements, skipped steps, early answers)
   collects rollouts on ``train`` tasks of the bundled sites (accessibility-tree observations,
   model-facing ``click(e12)`` actions), graded and judged; two datasets from the SAME
   trajectories: ``curated`` (the filtered-BC recipe: judged successes, cleaned, deduplicated)
   and ``unfiltered`` (every graded trajectory, failures included);
2. the candidate generator's oracle coverage on the curated SFT rows (share of expert steps
   whose action is a candidate), overall and per site;
3. training: the ranker (frozen MiniLM + small scorer) by SFT on each dataset (``--quick``: on
   the curated one only, ``--sft-unfiltered`` adds the other), then on-policy RL from the
   curated SFT checkpoint in each configuration ``--rl-variants`` names (:data:`RL_VARIANTS`:
   states from temperature-1 samples or greedy rollouts, the expert's action as an extra
   candidate, one iteration or two smaller ones). ``--rl-estimator step_grpo``: candidates at
   the visited states, scored by the exact PRM; or ``grpo`` over ``--group`` rollouts per task;
   PPO-clip, with ``--rl-anchor-coef`` × the SFT loss on the curated rows in every update;
   ``--rl-task-pool N``: the tasks sampled are the ones a greedy probe of N failed first. SFT
   throughput (examples/s) of the ranker and of the tiny VLM on the same rows;
4. model selection on ``val``: every RL configuration is evaluated on the ``val`` split and all
   are reported; the one with the most ``val`` successes is "rl";
5. evaluation: untrained → SFT (unfiltered) → SFT (curated) → RL on held-out ``test`` tasks of
   the training sites and on the ``ood`` site, ``--eval-n`` episodes each (greedy), success with
   95% Wilson intervals, and the differences, paired on the same tasks (``--no-eval-untrained``,
   ``--no-eval-ood``: leave those evaluations out, the slowest: every episode of them fails and
   runs all its steps).

Everything is the product's own code path (collect / judge / curate / train / evaluate library
functions, in one process with one sites server and one Chromium), into a fresh warehouse.
The bench fails (exit 1) when a stage produced nothing; it reports, never asserts, the aims.

    python bench/learning.py [--quick] [--home DIR] [--eval-n 320] ...
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FULL = dict(
    # --seed: the demonstrations' tasks and slips, SFT's initialisation and data order, RL's
    # rollout tasks and update order; the suite, the sites and the val / test tasks stay fixed
    seed=0,
    suite_version="3",  # with the four headroom templates (sites.tasks.SUITE_VERSIONS; 2: without)
    tasks=2400,
    # Pre-registered SFT start: 120 demonstrations of the noisy expert (about 90 judged
    # successes), so the start has headroom; ``--collect 360`` is the second, reported arm
    # (the 66%-start of earlier rounds).
    collect=120,
    noise=0.1,
    epochs=12,
    batch=32,
    eval_n=320,  # test tasks (the split has 381): enough pairs for McNemar at +5 points
    val_n=160,  # val tasks for the choice among SFT and the RL configurations
    eval_max_steps=30,
    rl_iterations=3,
    rl_tasks=96,
    rl_max_steps=30,
    rl_estimator="step_best",
    rl_scorer="reference",
    rl_select="first_error",
    rl_buffer=True,
    rl_lr=2e-3,
    rl_temperature=0.0,
    group=1,
    prm_k=4,
    prm_max_states=600,
    rl_anchor_coef=1.0,
    rl_task_pool=0,
    rl_ppo_epochs=10,
    rl_expert_candidate=True,
    rl_variants="dagger",
    vlm_steps=5,
    vlm_batch=8,
    sft_unfiltered=False,
    eval_untrained=False,
    eval_ood=False,
    rl=True,  # --no-rl: stop after the SFT evaluations (e.g. to size a suite's headroom)
)
# The quick size checks that every stage runs and feeds the next, not what the figures are: one
# ranker SFT, short evaluations, one RL configuration of 2 iterations over 4 tasks, one small
# tiny-VLM step. The ranker SFT gets the full size's epochs: after the first, an epoch reuses
# the cached encodings (cheap), and a barely trained policy gives RL batches without a signal.
QUICK = dict(
    FULL,
    tasks=160,
    collect=24,
    noise=0.12,
    batch=16,
    eval_n=3,
    val_n=3,
    eval_max_steps=8,
    rl_iterations=2,
    rl_tasks=4,
    rl_max_steps=12,
    prm_k=3,
    prm_max_states=12,
    vlm_steps=1,
    vlm_batch=2,
    sft_unfiltered=False,
    rl_variants="dagger",
)

#: The RL configurations ``--rl-variants`` names, each a change to the bench's RL settings: every
#: one trains from the SFT checkpoint and is evaluated on ``val``; the best on ``val`` (SFT itself
#: a candidate) is the one evaluated on ``test`` (ties: the earlier, SFT first). A value may be a
#: function of the settings.
RL_VARIANTS: dict[str, dict[str, Any]] = {
    # the default (the bench's settings): greedy rollouts on fresh train tasks each iteration,
    # states labelled during the rollouts with the reference's next step (free, exact), the
    # failed trajectories' states from their first error on, regression onto the best candidate,
    # every iteration's states kept (DAgger's aggregate), the SFT rows as anchor
    "dagger": {},
    "dagger-awr": {"rl_estimator": "step_awr"},  # AWR weights instead of the best candidate
    "dagger-all-states": {"rl_select": "failures_first"},  # every labelled state, not first errors
    # the earlier round's configurations: exact PRM by replay, PPO-clip, one iteration
    "sampled": {
        "rl_estimator": "step_grpo",
        "rl_scorer": "exact",
        "rl_select": "failures_first",
        "rl_buffer": False,
        "rl_temperature": 1.0,
        "rl_expert_candidate": False,
        "rl_iterations": 1,
        "rl_tasks": 48,
        "prm_max_states": 150,
        "rl_lr": 3e-4,
        "rl_ppo_epochs": 2,
    },
    "greedy+expert": {
        "rl_estimator": "step_grpo",
        "rl_scorer": "exact",
        "rl_select": "failures_first",
        "rl_buffer": False,
        "rl_iterations": 1,
        "rl_tasks": 48,
        "prm_max_states": 150,
        "rl_lr": 3e-4,
        "rl_ppo_epochs": 2,
    },
}

CURATED = """
name: bench-curated
description: "Judged successes of the noisy expert, cleaned and deduplicated (filtered BC)."
sources: {{splits: [train], runs: [{run}]}}
filters:
  - verdict: {{judges: [programmatic], verdict: success, min_agreement: 1.0}}
  - drop_invalid_steps: {{}}
  - drop_loops: {{max_repeats: 2}}
  - dedup_trajectories: {{}}
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
"""
UNFILTERED = """
name: bench-unfiltered
description: "Every graded trajectory of the noisy expert, failures included."
sources: {{splits: [train], runs: [{run}]}}
filters: []
output: {{sft: true, rl_groups: false, preferences: false, k_images: 1}}
gates: {{success_rate: [0.0, 1.0]}}
"""


RESULTS: Any = None  # bench.results.Results: every line printed, the figures


def say(msg: str) -> None:
    if RESULTS is not None:
        RESULTS.say(msg)
    else:
        print(msg, flush=True)


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


class Bench:
    """The bench's state: one warehouse, one sites server, one Chromium, timings."""

    def __init__(self, args: argparse.Namespace, wh: Any, server: Any, browser: Any) -> None:
        self.a, self.wh, self.server, self.browser = args, wh, server, browser
        self.times: dict[str, float] = {}
        self.evals: dict[tuple[str, str], dict[str, Any]] = {}
        self.variants: list[str] = []  # the RL configurations tried, in order
        self.started = time.perf_counter()

    def timed(self, name: str, start: float) -> None:
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


# -- stages ---------------------------------------------------------------------------------------


def generate(b: Bench) -> None:
    from sites.tasks import generate as gen
    from warehouse.tasks import put_tasks

    tasks = gen(b.a.tasks, seed=0, version=b.a.suite_version)
    put_tasks(b.wh, tasks)
    by: dict[str, int] = {}
    for t in tasks:
        by[t.split] = by.get(t.split, 0) + 1
    splits = ", ".join(f"{k} {v}" for k, v in sorted(by.items()))
    say(f"tasks: {len(tasks)} bundled, suite version {b.a.suite_version} ({splits})")


async def expert_run(
    b: Bench,
    name: str,
    *,
    split: str = "train",
    n: int,
    task_ids: tuple[str, ...] = (),
    noise: float = 0.0,
    noise_kind: str = "random",
    collect: dict[str, Any] | None = None,
) -> str:
    """The scripted expert on ``n`` tasks of ``split`` (or exactly ``task_ids``), with
    ``noise`` of ``noise_kind`` (0: flawless), judged by the programmatic judge; its run id.
    ``collect``: other collect settings (default: accessibility-tree prompts, no screenshots)."""
    from stages.collect import CollectConfig, run_collect
    from stages.judge import JudgeConfig, run_judge

    t0 = time.perf_counter()
    cfg = CollectConfig(
        split=split,
        n_tasks=n,
        task_ids=task_ids,
        policy="expert",
        noise=noise,
        noise_kind=noise_kind,
        prompt_mode="a11y",
        max_steps=26,  # the longest reference has 21 steps; a derailed expert stops sooner
        action_timeout_s=1.5,
        concurrency=8,
        run_name=name,
    )
    cfg = dataclasses.replace(cfg, **(collect or {}))
    res = await run_collect(b.wh, cfg, server=b.server, browser=b.browser)
    # (run_judge runs its own event loop: off this one)
    judged = await asyncio.to_thread(
        run_judge, b.wh, JudgeConfig(judge="programmatic", run=res.run_id)
    )
    b.timed("collect", t0)
    noisy = f", noise {noise} ({noise_kind})" if noise else ""
    say(
        f"expert {name}{noisy}: {res.ran + res.skipped} trajectories, {res.steps} steps, "
        f"outcomes {res.by_status}; judged {judged.judged}"
    )
    return res.run_id


def build(b: Bench, text: str, out: Path) -> Any:
    from curation.build import build_dataset
    from curation.recipe import parse_recipe

    t0 = time.perf_counter()
    ds = build_dataset(b.wh, parse_recipe(text, "bench.yaml"), out_dir=out, blobs=b.wh.blobs)
    b.timed("curate", t0)
    say(f"dataset {ds.name}: {ds.counts}")
    return ds


def coverage(b: Bench, ds: Any) -> None:
    from collections import defaultdict

    from rollouts.ranker import oracle_coverage
    from training.data import find_dataset, sft_turns

    turns = sft_turns(find_dataset(b.wh, ds.dataset_id).export_path)
    by_site: dict[str, list] = defaultdict(list)
    for t in turns:
        by_site[t.meta.get("site") or "?"].append({"prompt": t.prompt, "completion": t.completion})
    rows = [r for v in by_site.values() for r in v]
    parts = ", ".join(f"{s} {oracle_coverage(v):.1%}" for s, v in sorted(by_site.items()))
    say(f"oracle coverage of the candidate generator: {oracle_coverage(rows):.1%} ({parts})")


def sft(
    b: Bench,
    ds: Any,
    label: str,
    splits: tuple[str, ...] = ("train",),
    max_steps: int | None = None,
    seed: int = 0,
) -> Any:
    """Ranker SFT on ``ds`` (``--epochs`` passes, or exactly ``max_steps`` steps of ``--batch``:
    then as many passes as that takes, so arms of different sizes get the same number of
    updates; ``seed``: initialisation and data order); says its loss curve's ends and fails if
    the loss did not fall."""
    from stages.train import SFTConfig, run_sft

    t0 = time.perf_counter()
    rows = max(1, ds.counts["sft"])
    epochs = -(-max_steps * b.a.batch // rows) if max_steps else b.a.epochs
    cfg = SFTConfig(
        dataset=ds.dataset_id,
        model="ranker",
        epochs=epochs,
        max_steps=max_steps,
        lr=2e-3,
        batch_size=b.a.batch,
        save_every=10_000,
        splits=splits,
        seed=seed,
    )
    res = run_sft(b.wh, cfg)
    secs = time.perf_counter() - t0
    b.timed(f"sft {label}", t0)
    first, last = loss_ends(b, res.training_run_id)
    say(
        f"sft {label}: {rows} rows, {res.last_step} steps ({epochs} epoch(s) allowed), "
        f"loss {first:.3f} -> {last:.3f}, {res.last_step * b.a.batch / secs:.0f} examples/s "
        "(ranker, incl. first-epoch encoding)"
    )
    if max_steps and res.last_step != max_steps:
        raise SystemExit(f"sft {label}: {res.last_step} steps, not {max_steps}")
    if not last < first:
        raise SystemExit(f"sft {label}: the loss did not fall ({first} -> {last})")
    return res


def loss_ends(b: Bench, training_run_id: str, most: int = 5) -> tuple[float, float]:
    """The mean loss of a training run's first and last few steps (a quarter of them, at most
    ``most``), from the metrics it logged."""
    losses = b.wh.sql(
        "SELECT step, value FROM metrics WHERE training_run_id = ? AND name = 'loss' ORDER BY step",
        [training_run_id],
    )["value"].to_list()
    k = max(1, min(most, len(losses) // 4))
    return _mean(losses[:k]), _mean(losses[-k:])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def vlm_throughput(b: Bench, ds: Any) -> None:
    """SFT examples/s of the tiny VLM on the same rows (text-only prompts here)."""
    import torch

    from training.data import find_dataset, sft_turns
    from training.load import load_trainable
    from training.losses import sft_loss

    size = b.a.vlm_batch
    turns = sft_turns(find_dataset(b.wh, ds.dataset_id).export_path)[: size * b.a.vlm_steps]
    model = load_trainable("tiny", home=b.wh.cfg.home)
    opt = torch.optim.AdamW(list(model.parameters()), lr=1e-3)
    model.train(True)
    t0 = time.perf_counter()
    done = 0
    for i in range(0, len(turns), size):
        batch = turns[i : i + size]
        loss = sft_loss(model.logprobs(batch), [t.weight for t in batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += len(batch)
    secs = time.perf_counter() - t0
    say(f"sft tiny VLM: {done} examples in {secs:.1f} s = {done / secs:.1f} examples/s")


def untrained(b: Bench) -> str:
    from training.ranker import RankerTrainable

    path = b.wh.cfg.home / "checkpoints" / "untrained-ranker"
    if not (path / "config.json").exists():
        RankerTrainable.new(seed=0).save(path)
    return str(path)


async def evaluate(
    b: Bench,
    label: str,
    checkpoint: str,
    split: str,
    task_ids: tuple[str, ...] = (),
    rollout: dict[str, Any] | None = None,
    n: int | None = None,
) -> dict[str, Any]:
    """``checkpoint`` greedy on ``n`` (default ``--eval-n``) tasks of ``split`` (or on exactly
    ``task_ids``); ``rollout``: other rollout settings (the ranker's by default)."""
    from stages.config import config_from_mapping
    from stages.evaluate import EvalConfig, run_evaluation

    t0 = time.perf_counter()
    rollout = {
        "split": split,
        "n_tasks": n or b.a.eval_n,
        "max_steps": b.a.eval_max_steps,
        **(rollout or {}),
    }
    if task_ids:
        rollout.update(n_tasks=len(task_ids), task_ids=list(task_ids))
    top = {"prompt_mode": rollout["prompt_mode"]} if "prompt_mode" in rollout else {}
    cfg = config_from_mapping(EvalConfig, {"checkpoint": checkpoint, "rollout": rollout, **top})
    res = await run_evaluation(b.wh, cfg, server=b.server, browser=b.browser)
    b.timed("evaluate", t0)
    s = dataclasses.asdict(res.summary)
    w = s.get("within")
    within = f", within templates [{w['ci_low']:6.1%}, {w['ci_high']:6.1%}]" if w else ""
    say(
        f"  {label:<22} {split:<5} {s['n_success']:>4}/{s['n']:<4} {s['rate']:6.1%} "
        f"[{s['ci_low']:6.1%}, {s['ci_high']:6.1%}]{within}  ({time.perf_counter() - t0:.0f} s)"
    )
    if s["n"] == 0:
        raise SystemExit(f"evaluation {label}/{split}: no episode ended with an outcome")
    b.evals[(label, split)] = {**s, "row": dataclasses.asdict(res.evaluation)}
    if RESULTS is not None:
        RESULTS.figures.setdefault("evaluations", {})[f"{label}/{split}"] = {
            k: s[k] for k in ("n", "n_success", "rate", "ci_low", "ci_high", "clustered", "within")
        }
    return b.evals[(label, split)]


RL_ATTEMPTS = 3


def variant(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """The bench's settings with RL variant ``name``'s changes."""
    if name not in RL_VARIANTS:
        raise SystemExit(f"--rl-variants: unknown {name!r}; known: {', '.join(RL_VARIANTS)}")
    changes = {k: v(args) if callable(v) else v for k, v in RL_VARIANTS[name].items()}
    return argparse.Namespace(**{**vars(args), **changes})


def described(a: argparse.Namespace) -> str:
    return (
        f"{a.rl_estimator} by {a.rl_scorer} on {a.rl_select} states, T {a.rl_temperature:g}, "
        f"expert candidate {'on' if a.rl_expert_candidate else 'off'}, "
        f"{a.rl_iterations} × ({a.rl_tasks} tasks, ≤{a.prm_max_states} states), "
        f"buffer {'on' if a.rl_buffer else 'off'}, lr {a.rl_lr:.1e}, {a.rl_ppo_epochs} epoch(s) "
        f"per iteration, anchor × {a.rl_anchor_coef:g}"
    )


async def rl(b: Bench, a: argparse.Namespace, start: str, anchor: str, name: str) -> Any:
    """On-policy RL from ``start`` with the settings ``a`` (a variant's) and ``--rl-estimator``:
    ``step_grpo`` (the default: at the states each iteration visited, ``--prm-k`` candidates of
    the policy, scored by the exact PRM, normalised per state; ``--rl-expert-candidate`` adds
    the reference's action at each state's aligned step) or ``grpo`` (trajectory reward
    normalised within each task's ``--group`` samples). ``--rl-anchor-coef`` > 0 adds that
    weight of the SFT loss on the ``anchor`` dataset (the curated one SFT trained on) to every
    update (PPO-ptx), so the templates an iteration's batch leaves out are not forgotten. A
    batch without a learning signal makes no update; as an RL loop would, draw another (the
    next sampling seed), up to :data:`RL_ATTEMPTS` times, and say so. If no attempt had a
    signal, the result is the unchanged start checkpoint (said)."""
    from stages.config import config_from_mapping
    from stages.train import RLConfig, run_rl

    t0 = time.perf_counter()
    for attempt in range(RL_ATTEMPTS):
        # RL's train tasks: an order of their own (not the demonstrations' seed-ordered tasks)
        seed = 1000 * (a.seed + 1) + 100 * attempt
        rollout = {
            "samples": a.group,
            "n_tasks": a.rl_tasks,
            "max_steps": a.rl_max_steps,
            "temperature": a.rl_temperature,
            "seed": seed,
        }
        prm = {
            "k": a.prm_k,
            "max_states": a.prm_max_states,
            "scorer": a.rl_scorer,
            "select": a.rl_select,
            "candidates": "top_k",
        }
        if a.rl_expert_candidate:
            prm["expert_candidate"] = True
        cfg = config_from_mapping(
            RLConfig,
            {
                "policy": start,
                "estimator": a.rl_estimator,
                "buffer": a.rl_buffer,
                "iterations": a.rl_iterations,
                "lr": a.rl_lr,
                "ppo_epochs": a.rl_ppo_epochs,
                "anchor_dataset": anchor if a.rl_anchor_coef else None,
                "anchor_coef": a.rl_anchor_coef,
                "task_pool": a.rl_task_pool,
                "rollout": rollout,
                "prm": prm,
            },
        )
        res = await run_rl(b.wh, cfg, say, server=b.server, browser=b.browser)
        if any(r.nonzero_advantage for r in res.iterations):
            break
        say(f"rl {name} (seed {seed}): no learning signal in any iteration's batch; next seed")
    else:
        say(f"rl {name}: no learning signal in {RL_ATTEMPTS} attempts; the policy is the start")
    b.timed(f"rl {name}", t0)
    for r in res.iterations:
        say(
            f"rl {name} iteration {r.iteration} ({a.rl_estimator}): mean reward of the samples "
            f"{r.mean_reward:.3f} ({r.trajectories} trajectories, "
            f"{r.nonzero_advantage}/{r.turns} turns with a learning signal)"
        )
    if a.rl_anchor_coef:
        say(f"rl {name} anchor: SFT loss on {anchor} × {a.rl_anchor_coef} in every update")
    return res


async def rl_variants(b: Bench, start: str, anchor: str) -> tuple[str, Any]:
    """Every ``--rl-variants`` configuration from ``start``, each evaluated on ``val``; the one
    with the most ``val`` successes (ties: the first listed), with its result. Every
    configuration tried is reported, with its ``val`` figures and settings."""
    names = [n.strip() for n in b.a.rl_variants.split(",") if n.strip()]
    if not names:
        raise SystemExit("--rl-variants: name at least one configuration")
    tried: dict[str, Any] = {}
    for name in names:
        a = variant(b.a, name)
        say(f"rl {name}: {described(a)}")
        tried[name] = await rl(b, a, start, anchor, name)
        await evaluate(b, f"rl {name}", tried[name].checkpoint, "val", n=b.a.val_n)
        b.variants.append(name)
    # SFT itself is a candidate: RL is kept only where it beat its start on val
    b.evals[("rl sft", "val")] = b.evals[("sft curated", "val")]
    names = ["sft", *names]
    best = max(names, key=lambda n: (b.evals[(f"rl {n}", "val")]["n_success"], -names.index(n)))
    say("configurations tried (all from the SFT checkpoint; chosen on val; sft: no RL):")
    for name in names:
        e = b.evals[(f"rl {name}", "val")]
        mark = "  <- chosen" if name == best else ""
        how = described(variant(b.a, name)) if name != "sft" else "the SFT checkpoint"
        say(f"  {name:<20} val {e['n_success']}/{e['n']} {e['rate']:.1%}  ({how}){mark}")
        if RESULTS is not None:
            RESULTS.figures.setdefault("rl_variants", {})[name] = {
                "settings": how,
                "val": {k: e[k] for k in ("n", "n_success", "rate")},
                "chosen": name == best,
            }
    return best, tried.get(best)


def differences(
    b: Bench,
    pairs: list[tuple[str, str]] | None = None,
    force: frozenset[tuple[str, str]] = frozenset(),
    common_tasks: bool = False,
) -> None:
    """B − A for the checkpoints evaluated on the same tasks: paired (every checkpoint is
    evaluated greedily on the same seeded tasks of deterministic sites): the template-clustered
    bootstrap interval and the exact McNemar test, Newcombe's unpaired interval beside them.
    ``pairs`` (A, B): default the learning bench's; ``force``: pairs compared although their
    evaluation protocols differ (on purpose, e.g. prompt modes), which the line then says;
    ``common_tasks``: pair evaluations of different sizes on the tasks both ran."""
    from training.evaluate import ProtocolMismatch, compare_evaluations

    pairs = pairs or [
        ("untrained", "sft curated"),
        ("sft unfiltered", "sft curated"),
        *(("sft curated", f"rl {name}") for name in b.variants),
        ("sft curated", "rl"),
    ]
    say(
        "differences (B - A; paired on the same tasks: 95% bootstrap intervals resampling tasks "
        "within templates (the suite's templates fixed) and whole templates (new templates), "
        "exact McNemar p; Newcombe's unpaired interval beside):"
    )
    for split in ("val", "test", "ood"):
        for a, c in pairs:
            ea, ec = b.evals.get((a, split)), b.evals.get((c, split))
            if ea is None or ec is None:
                continue
            try:
                r = compare_evaluations(
                    b.wh, ea["row"], ec["row"], force=(a, c) in force, common_tasks=common_tasks
                )
            except ProtocolMismatch as exc:
                say(f"  {split:<5} {c} - {a}: not compared ({exc})")
                continue
            newcombe = (
                f"Newcombe [{r['newcombe_low']:+.1%}, {r['newcombe_high']:+.1%}]"
                if "newcombe_low" in r
                else "unpaired"
            )
            if r["method"] != "paired":
                say(
                    f"  {split:<5} {c} - {a}: {r['diff']:+.1%} [{r['ci_low']:+.1%}, "
                    f"{r['ci_high']:+.1%}] unpaired ({r['unpaired_because']})"
                )
                continue
            p = r["mcnemar_p"]
            if RESULTS is not None:
                keep = ("diff", "ci_low", "ci_high", "n_pairs", "a_only", "b_only", "mcnemar_p")
                keep += ("clusters", "newcombe_low", "newcombe_high", "within_low", "within_high")
                RESULTS.figures.setdefault("differences", {})[f"{split}/{c} - {a}"] = {
                    k: r.get(k) for k in keep
                }
            say(
                f"  {split:<5} {c} - {a}: {r['diff']:+.1%}, within templates "
                f"[{r['within_low']:+.1%}, {r['within_high']:+.1%}], new templates "
                f"[{r['ci_low']:+.1%}, {r['ci_high']:+.1%}]; paired on {r['n_pairs']} tasks "
                f"({r['clusters']} templates), only A {r['a_only']} / only B {r['b_only']}, "
                "McNemar p "
                + (f"{p:.3g}" if p is not None else "n/a")
                + f"; {newcombe}"
                + (
                    f"; protocols differ in {', '.join(r['protocol_differs'])}"
                    if r.get("protocol_differs")
                    else ""
                )
            )


async def main_async(
    args: argparse.Namespace, home: Path, run: Any = None, script: str = "bench/learning.py"
) -> None:
    """``run(bench, home)`` (default: :func:`run_all`) with one sites server, one Chromium and a
    fresh warehouse at ``home``; the stages' times and the total at the end."""
    from rollouts.browser import launch
    from sites.server import SiteServer
    from warehouse import Warehouse, WarehouseConfig

    run = run or run_all
    say(f"{script} ({'quick' if args.quick else 'full'}), {load()}, home {home}")
    server = SiteServer(seed=0, mode="process").start()
    from playwright.async_api import async_playwright

    t_all = time.perf_counter()
    try:
        async with async_playwright() as pw:
            browser = await launch(pw)
            with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
                b = Bench(args, wh, server, browser)
                await run(b, home)
            await browser.close()
    finally:
        server.stop()
    times = ", ".join(f"{k} {v:.0f} s" for k, v in b.times.items())
    if RESULTS is not None:
        RESULTS.figures["seconds"] = {**b.times, "total": time.perf_counter() - t_all}
    say(f"total {time.perf_counter() - t_all:.0f} s ({times}); {load()}")


async def run_all(b: Bench, home: Path) -> None:
    generate(b)
    run = await expert_run(
        b, "bench-noisy-expert", n=b.a.collect, noise=b.a.noise, collect={"seed": b.a.seed}
    )
    curated = build(b, CURATED.format(run=json.dumps(run)), home / "datasets")
    unfiltered = build(b, UNFILTERED.format(run=json.dumps(run)), home / "datasets")
    coverage(b, curated)
    sft_c = sft(b, curated, "curated", seed=b.a.seed)
    sft_u = sft(b, unfiltered, "unfiltered", seed=b.a.seed) if b.a.sft_unfiltered else None
    vlm_throughput(b, curated)
    say(
        f"evaluation (ranker, greedy, {b.a.eval_n} test / {b.a.val_n} val tasks, "
        f"max {b.a.eval_max_steps} steps):"
    )
    if b.a.eval_untrained:
        await evaluate(b, "untrained", untrained(b), "test")
    if sft_u is not None:
        await evaluate(b, "sft unfiltered", sft_u.checkpoint, "test")
    await evaluate(b, "sft curated", sft_c.checkpoint, "val", n=b.a.val_n)
    if b.a.rl:
        best, rl_res = await rl_variants(b, sft_c.checkpoint, curated.dataset_id)
    await evaluate(b, "sft curated", sft_c.checkpoint, "test")
    if b.a.eval_ood:
        await evaluate(b, "sft curated", sft_c.checkpoint, "ood")
    by_template(b, "sft curated", "test")
    if b.a.rl:
        say(f"rl = {best} (chosen on val), on the held-out splits:")
        if rl_res is None:  # SFT won on val: the same checkpoint, the same greedy episodes
            say("  (SFT was chosen: RL's test figures are SFT's)")
            b.evals[("rl", "test")] = b.evals[("sft curated", "test")]
        else:
            await evaluate(b, "rl", rl_res.checkpoint, "test")
            if b.a.eval_ood:
                await evaluate(b, "rl", rl_res.checkpoint, "ood")
        by_template(b, "rl", "test")
    else:
        say("rl: not run (--no-rl)")
    differences(b)
    if b.a.rl:
        aims(b)


def aims(b: Bench) -> None:
    """The issue's aims for RL − SFT on ``test``, each said as met or missed with its figure:
    ≥ +5 points, McNemar p < 0.05, the within-template bootstrap's lower bound > 0, no template
    losing more than 2 tasks. Reported, never asserted."""
    r = (RESULTS.figures.get("differences", {}) if RESULTS is not None else {}).get(
        "test/rl - sft curated"
    )
    if r is None:
        say("aims: no paired test comparison of rl and sft")
        return
    before = solved_by_template(b, "sft curated", "test")
    after = solved_by_template(b, "rl", "test")
    worst = min(
        ((after.get(t, (0, 0))[0] - k, t) for t, (k, _) in before.items()), default=(0, "-")
    )
    p = r["mcnemar_p"]
    checks = {
        "diff >= +5 points": (r["diff"] >= 0.05, f"{r['diff']:+.1%}"),
        "McNemar p < 0.05": (p is not None and p < 0.05, f"p {p:.3g}" if p is not None else "n/a"),
        "within-template lower bound > 0": (r["within_low"] > 0, f"{r['within_low']:+.1%}"),
        "no template loses > 2 tasks": (worst[0] >= -2, f"worst {worst[1]} {worst[0]:+d}"),
        ">= 300 test tasks": (r["n_pairs"] >= 300, f"{r['n_pairs']} pairs"),
    }
    say("aims (RL - SFT on test):")
    for name, (ok, figure) in checks.items():
        say(f"  {'met   ' if ok else 'MISSED'} {name}: {figure}")
    if RESULTS is not None:
        RESULTS.figures["aims"] = {k: {"met": ok, "figure": f} for k, (ok, f) in checks.items()}


def solved_by_template(b: Bench, label: str, split: str) -> dict[str, tuple[int, int]]:
    """(tasks solved, tasks) per template of an evaluation the bench ran."""
    from training.evaluate import per_task, run_outcomes

    row = b.evals[(label, split)]["row"]
    out: dict[str, tuple[int, int]] = {}
    df = per_task(run_outcomes(b.wh, row["run_id"], row.get("judge")))
    for template, success in df.select("template", "success").iter_rows():
        solved, n = out.get(template, (0, 0))
        out[template] = (solved + int(success or 0), n + 1)
    return out


def by_template(b: Bench, label: str, split: str) -> None:
    """Says (and records) an evaluation's solved share per template: where the headroom is."""
    table = solved_by_template(b, label, split)
    say(f"{label} on {split}, per template (solved of n):")
    for template, (solved, n) in sorted(table.items()):
        say(f"  {template:<24} {solved:>4} of {n:<4} {solved / n:6.1%}")
    if RESULTS is not None:
        figures = RESULTS.figures.setdefault("by_template", {})
        figures[f"{label}/{split}"] = {t: {"solved": k, "n": n} for t, (k, n) in table.items()}


def sized_args(
    doc: str, full: dict[str, Any], quick: dict[str, Any], argv: list[str] | None = None
) -> argparse.Namespace:
    """A bench's arguments: ``--quick``, ``--home``, ``--results`` and a flag per setting of
    ``full``; the settings not given take the ``quick`` or ``full`` size's value."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a seconds-to-minutes smoke size")
    p.add_argument("--home", type=Path, default=None, help="warehouse home (default: a temp dir)")
    p.add_argument(
        "--results", type=Path, default=None, help="results file (default: bench/results/)"
    )
    for k, v in full.items():
        if isinstance(v, bool):
            p.add_argument(f"--{k.replace('_', '-')}", action=argparse.BooleanOptionalAction)
        else:
            p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=None)
    args = p.parse_args(argv)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return sized_args(__doc__, FULL, QUICK, argv)


def run_bench(name: str, args: argparse.Namespace, run: Any = None) -> None:
    """Run a bench of this family: ``run`` (default: this bench's :func:`run_all`) in
    :func:`main_async`, at ``--home`` or in a temporary home; its results file written."""
    global RESULTS
    from bench.results import Results

    RESULTS = Results(name, args)
    script = f"bench/{name}.py"
    if args.home is not None:
        asyncio.run(main_async(args, args.home, run, script))
    else:
        prefix = f"webloop-{name.replace('_', '-')}-"
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            asyncio.run(main_async(args, Path(tmp) / "home", run, script))
    RESULTS.write(args.results, args.quick)


def main() -> None:
    run_bench("learning", parse_args())


if __name__ == "__main__":
    main()
