"""Curation build benchmark: a dataset built and exported from a large synthetic warehouse.

Two child processes, so each one's peak memory is its own:

1. **fill** (not part of the aim, timed apart): a DuckLake warehouse with the bundled task
   generator's tasks (default 2,000 over the 4 sites; train/test split, one site ``ood``), four
   collect runs (expert, two OpenAI-protocol models, an in-process HF model), 100k trajectories
   (groups of 4 samples; success / failure / infra_error / timeout / running / finished) with
   1M steps: screenshots from a pool of a few hundred distinct real PNGs and accessibility trees
   as the collector writes them (``aria_snapshot`` text), both in the content-addressed blob
   store; model-facing action texts in the grammar (the expert follows the tasks' reference
   solutions), action errors, unparseable outputs, no-op steps and loops; a programmatic
   judgment per trajectory with an outcome; PRM candidates + ``exact`` scores for the executed
   actions. Rows are built columnar (polars) and written with ``Warehouse.write_trajectories``
   in transactions of 10k trajectories.
2. **build**: the real ``curation.build.build_dataset`` with :data:`RECIPE` (the bundled
   ``filtered-bc.yaml`` plus the PRM filter, the DigiRL curriculum and RL groups: every filter
   kind runs). Prints the time of each stage (validate, pin, select and each of its reads and
   filters, examples, gates, export, register), the total, and the peak RSS
   (``getrusage``: this process and its children). Then counts independently, in SQL over the
   lake at the pinned snapshot (the MiniLM near-duplicate rule re-applied in Python), how many
   trajectories, steps and examples the recipe must give, and compares them with the build's
   counts, the exported Parquet and ``datasets`` folders and the ``dataset_members`` rows: any
   mismatch exits non-zero.

Aim (issue 11): build + export under 60 s and under 4 GB peak on 2 cores.

    python bench/curation.py [--trajectories 100000] [--tasks 2000] [--screens 300]
                             [--per-task 8] [--quick] [--profile FILE] [--keep DIR]

``--per-task 0`` drops the recipe's per-task cap (at the default size 82k examples instead of
34k), to see how the build scales with its output.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import io
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from warehouse import Warehouse, WarehouseConfig  # noqa: E402
from warehouse.connection import LAKE  # noqa: E402
from warehouse.ids import make_id, traj_id_for  # noqa: E402
from warehouse.records import (  # noqa: E402
    Blob,
    Candidate,
    Judgment,
    Run,
    Step,
    StepScore,
    Task,
    Trajectory,
    conform,
)

RECIPE = """\
# bench/curation.py: curation/recipes/filtered-bc.yaml plus the PRM filter, the DigiRL
# curriculum and RL groups, so that every filter kind runs.
name: bench-filtered-bc
description: "Synthetic warehouse: judged-successful expert + model rollouts, PRM-filtered."
sources:
  suites: []
  splits: [train]
  runs: []
  policies: ["expert*", "openai*"]
filters:
  - verdict: {judges: [programmatic], verdict: success, min_agreement: 1.0}
  - prm_threshold: {scorer: exact, min_score: 0.5, unscored: keep}
  - drop_invalid_steps: {noop: true}
  - drop_loops: {max_repeats: 2}
  - length: {min_steps: 1, max_steps: 30}
  - dedup_trajectories: {}
  - dedup_tasks: {threshold: 0.92}
balance: {per_site: null, per_difficulty: null, per_task: 8}
curriculum:
  weights: intermediate
  horizon: [5, 10, 20]
include:
  interventions: false
  rationales: null
output:
  sft: true
  rl_groups: true
  preferences: false
  k_images: 3
gates:
  success_rate: [1.0, 1.0]
"""
MAX_STEPS, MIN_SCORE, NEAR_DUP = 30, 0.5, 0.92  # as in RECIPE (for the SQL check)

GROUP = 4  # samples per (run, task) group
# Trajectory lengths: 20 values, mean exactly 10 (N trajectories -> 10 N steps); 35 > max_steps.
LENGTHS = [*range(1, 18), 2, 10, 35]
# run index of each group, by share: expert 3/20, model A 7/20, model B 6/20, hf 4/20
RUN_PATTERN = [0, 1, 2, 1, 3, 1, 2, 0, 1, 2, 3, 1, 2, 1, 0, 2, 3, 1, 2, 3]
RUNS = [  # run_id, policy, self_summary
    ("bench-collect-expert", "expert", False),
    ("bench-collect-qwen-7b", "openai:qwen2.5-vl-7b", False),
    ("bench-collect-qwen-72b", "openai:qwen2.5-vl-72b", True),
    ("bench-collect-hf-tiny", "hf:tiny-qwen-vl", False),
]
PAGES = [
    "",
    "search",
    "results",
    "item",
    "cart",
    "checkout",
    "inbox",
    "message",
    "compose",
    "settings",
    "article",
    "flights",
    "booking",
    "confirm",
]
MODEL_ACTIONS = (
    [f"click(e{n})" for n in range(1, 41)]
    + [f'type(e{n}, "{w}")' for n, w in ((7, "kettle"), (12, "Lisbon"), (3, "budget review"))]
    + ["scroll(down)", "scroll(up)", 'press("Enter")', "back()", "wait()"]
    + [f"click({x}, {y})" for x, y in ((412, 230), (88, 41), (640, 512), (1010, 96))]
)
WORDS = [
    "search box",
    "results list",
    "cart",
    "first result",
    "filters",
    "menu",
    "message",
    "form",
    "confirmation",
    "sidebar",
]
CHUNK = 10_000  # trajectories per fill transaction
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
TRAJ_COLS = {f.name for f in dataclasses.fields(Trajectory)}
STEP_COLS = {f.name for f in dataclasses.fields(Step)}


# -- deterministic mixing (no Python loop per row) ----------------------------------------------


def mix(key: pl.Expr, seed: int) -> pl.Expr:
    """A well-spread non-negative int from an int key: multiplicative hash, high bits."""
    return ((key * 2654435761 + seed * 40503 + 12345) % 4294967296) // 65536


# -- fill -------------------------------------------------------------------------------------


def png(seed: int, w: int = 160, h: int = 100) -> bytes:
    """A small valid PNG (page-like blocks + a noise patch), distinct for each seed."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    img = Image.new("RGB", (w, h), (245, 245, 240))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, w, 14), fill=(rng.randrange(256), rng.randrange(256), 160))
    for _ in range(6):
        x, y = rng.randrange(w - 30), rng.randrange(18, h - 10)
        d.rectangle((x, y, x + rng.randrange(10, 30), y + 6), fill=(rng.randrange(200),) * 3)
    img.paste(Image.frombytes("RGB", (12, 12), rng.randbytes(12 * 12 * 3)), (w - 14, 1))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def a11y_tree(seed: int) -> str:
    """An accessibility snapshot as the collector stores it (``aria_snapshot(mode="ai")``)."""
    rng = random.Random(seed)
    lines = [
        "- banner:",
        '  - link "Home" [ref=e1] [cursor=pointer]',
        '  - searchbox "Search" [ref=e2]',
        '  - button "Accept cookies" [ref=e3] [cursor=pointer]',
        "- main:",
        f'  - heading "{PAGES[seed % len(PAGES)] or "home"} · page {seed}" [level=1] [ref=e4]',
    ]
    for n in range(5, 5 + rng.randrange(12, 36)):
        kind = rng.choice(["link", "button", "textbox", "listitem", "cell"])
        lines.append(f'  - {kind} "{rng.choice(WORDS)} {rng.randrange(1000)}" [ref=e{n}]')
    return "\n".join(lines)


DUPLICATE_EVERY = 10  # every 10th task is a copy of the one before under its own id


def make_tasks(n: int) -> list[Task]:
    """``n`` generated bundled tasks, splits as generated (instances of one template with other
    parameters are distinct tasks: the leakage gate does not confuse them), where every
    ``DUPLICATE_EVERY``-th task is the previous task registered again under another id (as when
    one benchmark is imported twice): real work for the near-duplicate task filter."""
    from sites.tasks import generate

    tasks = generate(n, seed=0)
    # a task's trajectories all come from one run (trajectory_chunk); copy a task of the same
    # run, and only of runs the recipe selects, so that both copies reach the filter
    inv = pow(7919, -1, n)
    run_of = [RUN_PATTERN[(t * inv % n) % len(RUN_PATTERN)] for t in range(n)]
    last: dict[int, int] = {}
    for i in range(n):
        if (
            i % DUPLICATE_EVERY == 1
            and i > 1
            and run_of[i] in last
            and not RUNS[run_of[i]][1].startswith("hf")
        ):
            tasks[i] = dataclasses.replace(tasks[last[run_of[i]]], task_id=tasks[i].task_id)
        last[run_of[i]] = i
    return tasks


def task_frame(tasks: list[Task]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(task_idx, task_id, site, split) and the reference actions (task_idx, pos, ref)."""
    info = pl.DataFrame(
        {
            "task_idx": range(len(tasks)),
            "task_id": [t.task_id for t in tasks],
            "site": [t.site for t in tasks],
            "split": [t.split for t in tasks],
        },
        schema={"task_idx": pl.Int64, "task_id": pl.Utf8, "site": pl.Utf8, "split": pl.Utf8},
    )
    refs = pl.DataFrame(
        [(i, p, a) for i, t in enumerate(tasks) for p, a in enumerate(t.reference)],
        schema={"task_idx": pl.Int64, "pos": pl.Int64, "ref": pl.Utf8},
        orient="row",
    )
    return info, refs


def action_json(texts: list[str]) -> dict[str, str]:
    """Canonical action text → ``steps.action`` JSON (what the collector stores)."""
    from rollouts.actions import ParseError, format_action, parse_action, to_dict

    out = {}
    for text in texts:
        a = parse_action(text)
        if isinstance(a, ParseError) or format_action(a) != text:
            raise SystemExit(f"bench action {text!r} is not canonical grammar: {a}")
        out[text] = json.dumps(to_dict(a), sort_keys=True)
    return out


def trajectory_chunk(k0: int, k1: int, n_tasks: int, tasks: pl.DataFrame) -> pl.DataFrame:
    """Trajectory rows ``k0 <= k < k1`` (plus helper columns task_idx, run_idx, site, split)."""
    k = pl.col("k")
    g = k // GROUP
    df = pl.DataFrame({"k": pl.int_range(k0, k1, eager=True)}).with_columns(
        task_idx=((g % n_tasks) * 7919) % n_tasks,
        rnd=g // n_tasks,
        run_idx=pl.lit(pl.Series(RUN_PATTERN)).gather(g % len(RUN_PATTERN)),
        n_steps=pl.lit(pl.Series(LENGTHS)).gather((k * 7) % len(LENGTHS)),
        u=mix(k, 1) % 1000,
    )
    df = df.join(tasks, on="task_idx", how="left", maintain_order="left")
    runs = pl.DataFrame(
        {
            "run_idx": range(len(RUNS)),
            "run_id": [r[0] for r in RUNS],
            "policy": [r[1] for r in RUNS],
        }
    ).cast({"run_idx": pl.Int64})
    df = df.join(runs, on="run_idx", how="left", maintain_order="left")
    expert = pl.col("policy") == "expert"
    u = pl.col("u")
    status = (
        pl.when(expert & (u < 930)).then(pl.lit("success"))
        .when(expert & (u < 980)).then(pl.lit("failure"))
        .when(expert & (u < 995)).then(pl.lit("infra_error"))
        .when(expert).then(pl.lit("timeout"))
        .when(u < 450).then(pl.lit("success"))
        .when(u < 880).then(pl.lit("failure"))
        .when(u < 940).then(pl.lit("infra_error"))
        .when(u < 980).then(pl.lit("timeout"))
        .when(u < 990).then(pl.lit("running"))
        .otherwise(pl.lit("finished"))
    )  # fmt: skip
    ids = [traj_id_for(r, t, rnd * GROUP + kk % GROUP) for kk, r, t, rnd in rows_again(df)]
    groups = [make_id("group", r, t, rnd) for _, r, t, rnd in rows_again(df)]
    return df.with_columns(
        traj_id=pl.Series(ids),
        group_id=pl.Series(groups),
        sample_idx=pl.col("rnd") * GROUP + k % GROUP,
        status=status,
        task_version=pl.lit(1),
    )


def rows_again(df: pl.DataFrame):
    return df.select("k", "run_id", "task_id", "rnd").iter_rows()


def step_chunk(trajs: pl.DataFrame, refs: pl.DataFrame, screens: pl.DataFrame) -> pl.DataFrame:
    """Step rows of ``trajs``: screens, URLs, action texts, errors, outputs (helper columns
    ``k``, ``h`` kept for the candidates)."""
    s = trajs.select(
        "k", "traj_id", "task_idx", "site", "policy", "status", "n_steps", "run_id",
        step_idx=pl.int_ranges(0, pl.col("n_steps")),
    ).explode("step_idx")  # fmt: skip
    i, k = pl.col("step_idx"), pl.col("k")
    model = pl.col("policy") != "expert"
    loop = model & (mix(k, 3) % 50 == 0)  # 2% of model trajectories: an A/B screen loop
    s = s.with_columns(h=mix(k * 64 + i, 2))
    h = pl.col("h")
    stall = (model & (i > 0) & (h % 20 == 0)).cast(pl.Int64)  # the screen did not change
    s = s.with_columns(
        e=pl.when(loop).then(1 + i % 2).otherwise(i - stall.cum_sum().over("traj_id"))
    )
    e = pl.col("e")
    dev = pl.when(model & (e >= mix(k, 4) % 6)).then(mix(k, 5) % 3 + 1).otherwise(0)
    n_refs = refs.group_by("task_idx").agg(n_ref=pl.len().cast(pl.Int64))
    s = (
        s.with_columns(screen=(pl.col("task_idx") * 13 + e * 5 + dev * 101) % screens.height)
        .join(n_refs, on="task_idx", how="left", maintain_order="left")
        .with_columns(pos=e % pl.col("n_ref"))
        .join(refs, on=["task_idx", "pos"], how="left", maintain_order="left")
        .join(screens, on="screen", how="left", maintain_order="left")
    )
    page = pl.lit(pl.Series(PAGES)).gather(pl.col("screen") % len(PAGES))
    answered = (i == pl.col("n_steps") - 1) & pl.col("status").is_in(["success", "failure"])
    unparsable = model & ~answered & (h % 97 == 2)
    failed = model & ~answered & (h % 33 == 1)
    variant = pl.when(loop).then(0).otherwise(h % 2)
    pool = pl.lit(pl.Series(MODEL_ACTIONS))
    action_text = (
        pl.when(unparsable).then(pl.lit(None, pl.Utf8))
        .when(~model).then(pl.col("ref"))
        .when(answered).then(pl.lit('answer("done: ') + pl.col("site") + pl.lit('")'))
        .otherwise(pool.gather((pl.col("screen") * 3 + variant) % len(MODEL_ACTIONS)))
    )  # fmt: skip
    thought = (
        pl.when(~model).then(pl.lit("plan step ") + i.cast(pl.Utf8) + " of the reference")
        .otherwise(pl.lit("The ") + pl.lit(pl.Series(WORDS)).gather(h % len(WORDS))
                   + " is where the task continues; I act on it and check the page changes.")
    )  # fmt: skip
    summary = (
        pl.when(pl.col("run_id") == RUNS[2][0])
        .then(pl.lit("\nSummary: step ") + i.cast(pl.Utf8) + " on " + page)
        .otherwise(pl.lit(""))
    )
    s = s.with_columns(action_text=action_text, thought=thought)
    at, th = pl.col("action_text"), pl.col("thought")
    return s.with_columns(
        url=pl.concat_str(
            pl.lit("http://"), "site", pl.lit(".localhost:8001/"), page, pl.lit("?s="), "screen"
        ),
        title=pl.concat_str("site", pl.lit(" · "), page, pl.lit(" "), "screen"),
        model_output=pl.when(unparsable)
        .then(pl.lit("Thought: ") + th + " I am not sure what to do.")
        .otherwise(pl.lit("Thought: ") + th + summary + pl.lit("\nAction: ") + at),
        action_error=pl.when(unparsable)
        .then(pl.lit("parse error: no action found"))
        .when(failed)
        .then(pl.lit("no element matches ref e") + (h % 40).cast(pl.Utf8))
        .otherwise(pl.lit(None, pl.Utf8)),
        latency_model_s=(h % 300).cast(pl.Float64) / 100,
        latency_env_s=(h % 40).cast(pl.Float64) / 100,
    )


def extras(trajs: pl.DataFrame, steps: pl.DataFrame) -> list[tuple[pl.DataFrame, type]]:
    """Judgments (programmatic, per trajectory with an outcome; an error on infra errors), PRM
    candidates and ``exact`` scores: the executed action as candidate 0 (5% of steps unscored,
    15% below the recipe's 0.5), every 10th step a second candidate."""
    j = trajs.filter(pl.col("status").is_in(["success", "failure", "infra_error"])).select(
        judgment_id=pl.lit("judgment-") + pl.col("traj_id").str.slice(5),
        traj_id="traj_id",
        judge=pl.lit("programmatic"),
        judge_version=pl.lit("1"),
        verdict=pl.when(pl.col("status") == "infra_error").then(None).otherwise("status"),
        score=pl.when(pl.col("status") == "success")
        .then(1.0)
        .when(pl.col("status") == "failure")
        .then(0.0)
        .otherwise(None),
        error=pl.when(pl.col("status") == "infra_error")
        .then(pl.lit("no final page state: the browser crashed"))
        .otherwise(None),
        created_at=pl.col("created_at") + pl.duration(minutes=5),
    )
    scored = steps.filter(pl.col("action_text").is_not_null() & (pl.col("h") % 20 != 7))
    m = mix(pl.col("k") * 64 + pl.col("step_idx"), 6) % 100
    score0 = pl.when(m < 15).then(m / 100).otherwise(0.5 + (m - 15) / 170)
    c0 = scored.select(
        "traj_id", "step_idx", "action_text", "created_at", cand_idx=pl.lit(0), score=score0
    )
    c1 = scored.filter(pl.col("h") % 10 == 3).select(
        "traj_id", "step_idx", "created_at", action_text=pl.lit("scroll(down)"),
        cand_idx=pl.lit(1), score=1 - score0,
    )  # fmt: skip
    c = pl.concat([c0, c1.select(c0.columns)])
    cands = c.select(
        "traj_id", "step_idx", "cand_idx", "action_text",
        policy=pl.lit("expert"), run_id=pl.lit("bench-score-steps"),
        created_at=pl.col("created_at") + pl.duration(minutes=10),
    )  # fmt: skip
    scores = c.select(
        "traj_id", "step_idx", "cand_idx", "score",
        scorer=pl.lit("exact"), scorer_version=pl.lit("1"), run_id=pl.lit("bench-score-steps"),
        created_at=pl.col("created_at") + pl.duration(minutes=10),
    )  # fmt: skip
    return [
        (conform(Judgment, j), Judgment),
        (conform(Candidate, cands), Candidate),
        (conform(StepScore, scores), StepScore),
    ]


def fill(home: Path, n_trajs: int, n_tasks: int, n_screens: int) -> None:
    """Write the synthetic warehouse (see the module docstring) and check its row counts."""
    start = time.perf_counter()
    wh = Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""))
    tasks = make_tasks(n_tasks)
    wh.write(tasks)
    t_tasks = time.perf_counter() - start
    wh.write(
        [
            Run(
                run_id=rid,
                kind="collect",
                name=rid,
                status="completed",
                config={"policy": pol, "prompt_mode": "both", "k_images": 3, "self_summary": ss},
            )
            for rid, pol, ss in RUNS
        ]
    )
    shots = [wh.blobs.put_image(png(i)) for i in range(n_screens)]
    trees = [wh.blobs.put_text(a11y_tree(i)) for i in range(n_screens)]
    blobs = [Blob(p.hash, p.size, "image/png") for p in shots]
    blobs += [Blob(p.hash, p.size, "text/plain; charset=utf-8") for p in trees]
    wh.write(blobs)
    screens = pl.DataFrame(
        {
            "screen": range(n_screens),
            "screenshot_hash": [p.hash for p in shots],
            "a11y_hash": [p.hash for p in trees],
        },
        schema={"screen": pl.Int64, "screenshot_hash": pl.Utf8, "a11y_hash": pl.Utf8},
    )
    info, refs = task_frame(tasks)
    answers = {f'answer("done: {s}")' for s in info.get_column("site").unique().to_list()}
    actions = action_json(
        sorted(set(refs.get_column("ref").to_list()) | set(MODEL_ACTIONS) | answers)
    )
    n_steps = n_judg = n_scores = 0
    for k0 in range(0, n_trajs, CHUNK):
        trajs = trajectory_chunk(k0, min(n_trajs, k0 + CHUNK), len(tasks), info).with_columns(
            created_at=pl.lit(T0) + pl.duration(seconds=pl.col("k")),
            answer=pl.when(pl.col("status").is_in(["success", "failure"]))
            .then(pl.lit("done: ") + pl.col("site"))
            .otherwise(None),
            error=pl.when(pl.col("status") == "infra_error")
            .then(pl.lit("browser crashed: Target page, context or browser has been closed"))
            .otherwise(None),
            duration_s=pl.col("n_steps").cast(pl.Float64) * 1.7,
        )
        steps = step_chunk(trajs, refs, screens).with_columns(
            created_at=pl.lit(T0)
            + pl.duration(seconds=pl.col("k"), milliseconds=pl.col("step_idx")),
            action=pl.col("action_text").replace_strict(
                actions, default=None, return_dtype=pl.Utf8
            ),
        )
        more = extras(trajs, steps)
        traj_rows = conform(Trajectory, trajs.select([c for c in trajs.columns if c in TRAJ_COLS]))
        step_rows = conform(Step, steps.select([c for c in steps.columns if c in STEP_COLS]))
        wh.write_trajectories(traj_rows, step_rows, extra=more)
        n_steps += step_rows.height
        n_judg += more[0][0].height
        n_scores += more[2][0].height
        print(f"  fill: {k0 + traj_rows.height:,} trajectories, {n_steps:,} steps", flush=True)
    got = wh.sql(
        f"SELECT (SELECT count(*) FROM {LAKE}.trajectories) AS t, "
        f"(SELECT count(*) FROM {LAKE}.steps) AS s, (SELECT count(*) FROM {LAKE}.tasks) AS k"
    ).row(0)
    wh.close()
    if got != (n_trajs, n_steps, len(tasks)):
        raise SystemExit(f"fill: warehouse holds {got}, wrote {(n_trajs, n_steps, len(tasks))}")
    split = {s: sum(t.split == s for t in tasks) for s in ("train", "test", "ood")}
    print(
        f"fill: {len(tasks):,} tasks ({', '.join(f'{s} {n}' for s, n in split.items())}), "
        f"{len(RUNS)} runs, "
        f"{n_trajs:,} trajectories, {n_steps:,} steps, {len(blobs)} distinct blobs, "
        f"{n_judg:,} judgments, {n_scores:,} step scores in {time.perf_counter() - start:.1f} s "
        f"(tasks {t_tasks:.1f} s); peak RSS {peak_mb()[0]:,.0f} MB",
        flush=True,
    )


def peak_mb() -> tuple[float, float]:
    """Peak resident memory (MB) of this process and of its largest waited-for child."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, kids


# -- build --------------------------------------------------------------------------------------


def rss_mb() -> dict[str, float]:
    """This process's memory now (Linux ``/proc/self/status``, MB): VmRSS, VmHWM (peak so far),
    RssAnon (heap) and RssFile (mapped files, e.g. the spool the export memory-maps)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


class Clock:
    """Wall and CPU (this process, all threads) seconds of labelled sections, and the resident
    memory at the end of each."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, dict[str, float]]] = []
        self.mark = (time.perf_counter(), time.process_time())

    def lap(self, label: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.rows.append((label, now[0] - self.mark[0], now[1] - self.mark[1], rss_mb()))
        self.mark = now


def instrument(module: Any, name: str, label: Callable[..., str], rows: list) -> None:
    """Time every call of ``module.name`` into ``rows`` as (label, wall, cpu)."""
    fn = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        w, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            rows.append((label(*args), time.perf_counter() - w, time.process_time() - c))

    setattr(module, name, timed)


def recipe_text(per_task: int) -> str:
    """:data:`RECIPE` with the per-task cap ``per_task`` (0: no cap)."""
    return RECIPE.replace("per_task: 8", f"per_task: {per_task or 'null'}")


def build(home: Path, out: Path, profile: Path | None, per_task: int) -> None:
    """The real ``build_dataset`` with :data:`RECIPE`; per-stage times, peak RSS, the check."""
    from curation import select as sel_mod
    from curation.build import build_dataset
    from curation.recipe import parse_recipe

    inner: list[tuple[str, float, float]] = []  # select's reads and filters
    instrument(sel_mod, "scoped_trajectories", lambda *a: "read trajectories", inner)
    instrument(sel_mod, "steps_of", lambda *a: "read steps", inner)
    instrument(sel_mod, "_applied", lambda f, r, name, *a: f"filter {name}", inner)
    instrument(sel_mod, "task_history", lambda *a: "curriculum history", inner)
    instrument(sel_mod, "_interventions", lambda *a: "read interventions", inner)
    wh = Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""))
    wh.con.execute("SET enable_progress_bar = false")
    recipe = parse_recipe(recipe_text(per_task), "bench/curation.py:RECIPE")
    clock = Clock()

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)
        if line.startswith("curate "):
            clock.lap(line.split(":", 1)[0].removeprefix("curate "))

    start = (time.perf_counter(), time.process_time())
    if profile:
        import cProfile

        prof = cProfile.Profile()
        ds = prof.runcall(build_dataset, wh, recipe, out_dir=out, blobs=wh.blobs, progress=progress)
        prof.dump_stats(str(profile))
    else:
        ds = build_dataset(wh, recipe, out_dir=out, blobs=wh.blobs, progress=progress)
    wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    own, kids = peak_mb()
    print(f"{'build stage':28s}{'wall s':>9s}{'CPU s':>9s}   memory at its end (MB)")
    for label, w, c, m in clock.rows:
        mem = f"RSS {m['VmRSS']:,.0f} (heap {m['RssAnon']:,.0f}, files {m['RssFile']:,.0f})"
        print(f"stage {label:22s}{w:>9.2f}{c:>9.2f}   {mem}")
        if label == "select":
            for sub, sw, sc in inner:
                print(f"  select: {sub:18s}{sw:>9.2f}{sc:>9.2f}")
    print(f"stage {'total':22s}{wall:>9.2f}{cpu:>9.2f}   (aim: under 60 s wall)")
    print(
        f"peak RSS: build process {own:,.0f} MB, its largest child {kids:,.0f} MB, "
        f"together at most {own + kids:,.0f} MB (aim: under 4,096 MB)"
    )
    meta = json.loads((Path(ds.export_path) / "metadata.json").read_text())
    for r in meta["filters"]:
        print(
            f"  removed by {r['name']}: {r['trajectories_removed']:,} trajectories, "
            f"{r['steps_removed']:,} steps"
        )
    check(wh, ds, per_task)


# -- the independent count -----------------------------------------------------------------------

EXPECTED_SQL = f"""
WITH tk AS (
    SELECT task_id, split, instruction FROM {LAKE}.tasks AT (VERSION => $v)
    QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY version DESC) = 1
), scoped AS (
    SELECT t.traj_id, t.task_id, t.n_steps, tk.instruction
    FROM {LAKE}.trajectories AS t AT (VERSION => $v) JOIN tk USING (task_id)
    WHERE tk.split = 'train' AND (t.policy LIKE 'expert%' OR t.policy LIKE 'openai%')
      AND t.status NOT IN ('infra_error', 'timeout', 'running')
), verdicts AS (
    SELECT traj_id, verdict, error FROM {LAKE}.judgments AT (VERSION => $v)
    WHERE judge = 'programmatic'
    QUALIFY row_number() OVER (PARTITION BY traj_id
                               ORDER BY created_at DESC, judge_version DESC) = 1
), passing AS (
    SELECT s.* FROM scoped s JOIN verdicts v USING (traj_id)
    WHERE v.verdict = 'success' AND v.error IS NULL AND s.n_steps BETWEEN 1 AND $max_steps
), st AS (
    SELECT traj_id, step_idx, url, coalesce(screenshot_hash, a11y_hash) AS obs, action_text,
           action_error, lead(coalesce(screenshot_hash, a11y_hash)) OVER w AS next_obs,
           lead(url) OVER w AS next_url, lead(step_idx) OVER w AS next_idx,
           row_number() OVER (PARTITION BY traj_id, coalesce(screenshot_hash, a11y_hash),
                              action_text ORDER BY step_idx) AS occurrence
    FROM {LAKE}.steps AT (VERSION => $v)
    WHERE traj_id IN (SELECT traj_id FROM passing)
    WINDOW w AS (PARTITION BY traj_id ORDER BY step_idx)
), latest AS (
    SELECT traj_id, step_idx, cand_idx, score FROM {LAKE}.step_scores AT (VERSION => $v)
    WHERE scorer = 'exact' AND error IS NULL AND score IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY traj_id, step_idx, cand_idx
                               ORDER BY created_at DESC, scorer_version DESC) = 1
), taken AS (
    SELECT c.traj_id, c.step_idx, c.action_text, max(s.score) AS score
    FROM {LAKE}.candidates AS c AT (VERSION => $v) JOIN latest s USING (traj_id, step_idx, cand_idx)
    GROUP BY ALL
), kept AS (
    SELECT st.traj_id, st.step_idx FROM st
    LEFT JOIN taken p ON p.traj_id = st.traj_id AND p.step_idx = st.step_idx
                     AND p.action_text = st.action_text
    WHERE st.action_error IS NULL AND st.action_text IS NOT NULL
      AND NOT coalesce(st.next_obs = st.obs
                       AND st.next_url IS NOT DISTINCT FROM st.url
                       AND st.next_idx = st.step_idx + 1, false)
      AND NOT (st.occurrence > 2 AND st.obs IS NOT NULL)
      AND coalesce(p.score >= $min_score, true)
), seqs AS (
    SELECT traj_id,
           string_agg(coalesce(obs, '') || chr(30) || coalesce(action_text, ''),
                      chr(31) ORDER BY step_idx) AS seq
    FROM st GROUP BY traj_id
), live AS (
    SELECT p.traj_id, p.task_id, p.instruction, q.seq, count(*) AS kept_steps
    FROM passing p JOIN kept USING (traj_id) JOIN seqs q USING (traj_id)
    GROUP BY p.traj_id, p.task_id, p.instruction, q.seq
)
SELECT task_id, any_value(instruction) AS instruction, min(traj_id) AS traj_id,
       arg_min(kept_steps, traj_id) AS kept_steps, md5(min(traj_id)) AS ord
FROM live GROUP BY task_id, seq
"""


def expected(wh: Warehouse, snapshot_id: int, per_task: int) -> tuple[int, int]:
    """(trajectories, steps) the recipe must select, counted without curation.select: SQL for
    sources, infra exclusion, verdict, PRM, invalid/no-op/loop steps, length and trajectory
    dedup; the near-duplicate task rule (first task id of each cluster stays; instances of one
    template with other parameters are not duplicates) and the per-task
    cap (first N by md5(traj_id)) in polars, with MiniLM similarities from curation.embed."""
    from curation.embed import distinct_instances, near_duplicates, template_key

    live = wh.sql(EXPECTED_SQL, {"v": snapshot_id, "max_steps": MAX_STEPS, "min_score": MIN_SCORE})
    tasks = live.select("task_id", "instruction").unique("task_id").sort("task_id")
    ids, texts = tasks.get_column("task_id").to_list(), tasks.get_column("instruction").to_list()
    meta = wh.sql(f"SELECT task_id, any_value(meta) AS meta FROM {LAKE}.tasks GROUP BY 1").rows()
    keys = {tid: template_key(m) for tid, m in meta}
    earlier: dict[int, list[int]] = {}
    for i, j, _ in near_duplicates(texts, None, NEAR_DUP):
        if not distinct_instances(keys.get(ids[i]), keys.get(ids[j])):
            earlier.setdefault(j, []).append(i)
    dropped: set[int] = set()
    for j in range(len(ids)):
        if any(i not in dropped for i in earlier.get(j, [])):
            dropped.add(j)
    final = live.filter(~pl.col("task_id").is_in([ids[j] for j in dropped]))
    if per_task:
        final = final.filter(pl.col("ord").rank("ordinal").over("task_id") <= per_task)
    return final.height, int(final.get_column("kept_steps").sum() or 0)


def check(wh: Warehouse, ds: Any, per_task: int) -> None:
    """Exit non-zero unless the build, the export and the members match the SQL count."""
    import datasets
    import pyarrow.parquet as pq

    n_trajs, n_steps = expected(wh, ds.snapshot_id, per_task)
    path = Path(ds.export_path)
    members = wh.sql(
        f"SELECT count(*) FILTER (WHERE step_idx IS NULL) AS t, "
        f"count(*) FILTER (WHERE step_idx IS NOT NULL) AS s "
        f"FROM {LAKE}.dataset_members WHERE dataset_id = ?",
        [ds.dataset_id],
    ).row(0)
    found = {
        "build trajectories": ds.counts.get("trajectories"),
        "build steps": ds.counts.get("steps"),
        "build sft": ds.counts.get("sft"),
        "build rl": ds.counts.get("rl"),
        "parquet sft": pq.read_metadata(path / "parquet" / "sft.parquet").num_rows,
        "parquet rl": pq.read_metadata(path / "parquet" / "rl.parquet").num_rows,
        "datasets sft": datasets.load_from_disk(str(path / "sft")).num_rows,
        "members trajectories": members[0],
        "members steps": members[1],
    }
    want = {k: n_trajs if k.endswith(("trajectories", " rl")) else n_steps for k in found}
    bad = {k: (found[k], want[k]) for k in found if found[k] != want[k]}
    print(
        f"expected (independent SQL count): {n_trajs:,} trajectories, {n_steps:,} steps = "
        f"{n_steps:,} sft examples, {n_trajs:,} rl rows"
    )
    print("found: " + ", ".join(f"{k} {v:,}" for k, v in found.items()))
    if bad or n_steps == 0:
        raise SystemExit(f"curation bench: counts differ from the SQL count (found, want): {bad}")
    print("check: OK (build, export and members match the independent count)")


# -- driver -------------------------------------------------------------------------------------


def child(stage: str, args: argparse.Namespace, home: Path, out: Path) -> None:
    """Run one stage in a fresh interpreter (its own peak memory); exit on its failure."""
    cmd = [
        sys.executable,
        __file__,
        "--stage",
        stage,
        "--home",
        str(home),
        "--out",
        str(out),
        "--trajectories",
        str(args.trajectories),
        "--tasks",
        str(args.tasks),
        "--screens",
        str(args.screens),
        "--per-task",
        str(args.per_task),
    ]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    env = {
        **os.environ,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TQDM_DISABLE": "1",
    }
    rc = subprocess.run(cmd, env=env).returncode
    if rc:
        raise SystemExit(f"curation bench: the {stage} stage exited with {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=2_000)
    ap.add_argument("--screens", type=int, default=300, help="distinct screenshots (and trees)")
    ap.add_argument("--per-task", type=int, default=8, help="the recipe's cap (0: none)")
    ap.add_argument("--quick", action="store_true", help="2k trajectories, 200 tasks, 40 screens")
    ap.add_argument("--profile", type=Path, help="cProfile the build into this file")
    ap.add_argument("--keep", type=Path, help="work here and keep it; reuse a filled warehouse")
    ap.add_argument("--stage", choices=["fill", "build"], help=argparse.SUPPRESS)
    ap.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.trajectories, args.tasks, args.screens = 2_000, 200, 40
    if args.trajectories % len(LENGTHS):
        ap.error(f"--trajectories must be a multiple of {len(LENGTHS)} (the length pattern)")
    if args.tasks % 7919 == 0:
        ap.error("--tasks must not be a multiple of 7919 (the task permutation's step)")
    if args.stage == "fill":
        return fill(args.home, args.trajectories, args.tasks, args.screens)
    if args.stage == "build":
        return build(args.home, args.out, args.profile, args.per_task)
    load = os.getloadavg()
    print(
        f"curation bench: {args.trajectories:,} trajectories, {args.trajectories * 10:,} steps, "
        f"{args.tasks:,} tasks, {args.screens} screens; load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="webloop-curation-bench-") as tmp:
        work = args.keep or Path(tmp)
        home, out = work / "home", work / "out"
        marker = work / f"filled-{args.trajectories}-{args.tasks}-{args.screens}"
        if marker.exists():
            print(f"fill: reusing {home}")
        else:
            child("fill", args, home, out)
            marker.touch()
        child("build", args, home, out)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
