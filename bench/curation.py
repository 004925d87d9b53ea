"""Curation build benchmark: a dataset built and exported from a large synthetic warehouse.

Two child processes, so each one's peak memory is its own:

1. **fill** (not part of the aim, timed apart): the synthetic warehouse of ``bench/synthetic.py``
   (:func:`bench.synthetic.fill`): the bundled task generator's tasks (default 2,000), four
   collect runs, 100k trajectories with 1M steps, screenshots and accessibility trees in the
   blob store, judgments, PRM candidates and scores.
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
import json
import os
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

from bench.synthetic import LENGTHS, fill, peak_mb  # noqa: E402
from warehouse import Warehouse, WarehouseConfig  # noqa: E402
from warehouse.connection import LAKE  # noqa: E402

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
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
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
    from bench.results import run_main

    run_main("curation", main, children=("--stage",))
