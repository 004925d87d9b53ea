"""The synthetic warehouse of the curation and dashboard benchmarks (``bench/curation.py``,
``bench/dashboard.py``): :func:`fill` writes it.

A DuckLake warehouse with the bundled task generator's tasks (default 2,000 over the 4 sites;
train/test split, one site ``ood``), four collect runs (expert, two OpenAI-protocol models, an
in-process HF model), N trajectories (groups of 4 samples; success / failure / infra_error /
timeout / running / finished) with 10 N steps: screenshots from a pool of a few hundred distinct
real PNGs and accessibility trees as the collector writes them (``aria_snapshot`` text), both in
the content-addressed blob store; model-facing action texts in the grammar (the expert follows
the tasks' reference solutions), action errors, unparseable outputs, no-op steps and loops; a
programmatic judgment per trajectory with an outcome; PRM candidates + ``exact`` scores for the
executed actions. Rows are built columnar (polars) and written with
``Warehouse.write_trajectories`` in transactions of 10k trajectories. Every value is a function
of the sizes alone: the same sizes give the same warehouse.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import random
import resource
import time
from pathlib import Path

import polars as pl

from warehouse import Warehouse, WarehouseConfig
from warehouse.connection import LAKE
from warehouse.ids import make_id, traj_id_for
from warehouse.records import (
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
    split = {s: sum(t.split == s for t in tasks) for s in ("train", "val", "test", "ood")}
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
