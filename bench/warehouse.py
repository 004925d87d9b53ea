"""Warehouse ingest and query benchmark.

Prints, in one run:
  * steps/s ingesting N realistic step rows (default 1M) in transactions of 1,000 steps
    (50 trajectories x 20 steps, each transaction also writing its trajectory rows) through
    ``Warehouse.write_trajectories`` into a DuckLake with the default SQLite catalog;
  * the same rows into a plain DuckDB file with the same schema (baseline, single process);
  * their ratio;
  * the trajectory-summary and success-by queries over the DuckLake (median of 5);
  * for guidance, the DuckLake ingest rate with larger transactions (--big-batch, 200k steps).

    python bench/warehouse.py [--steps 1000000] [--batch 1000] [--big-batch 5000]
                              [--big-steps 200000] [--quick]

Both stores' row counts are checked after ingest; a mismatch exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import polars as pl

sys.path.insert(0, str(Path(__file__).parents[1]))

from warehouse import Warehouse, WarehouseConfig
from warehouse.migrations import SCHEMA_DIR
from warehouse.records import Step, Trajectory, conform

STEPS_PER_TRAJ = 20


def batches(n_steps: int, batch: int) -> list[tuple[pl.DataFrame, pl.DataFrame]]:
    """Realistic (trajectories, steps) frames: hashes, URLs, CoT outputs, JSON actions."""
    per = batch // STEPS_PER_TRAJ
    out = []
    for b in range(n_steps // batch):
        i = pl.int_range(b * batch, (b + 1) * batch, eager=True)
        t = i // STEPS_PER_TRAJ
        traj = ("traj-" + t.cast(pl.Utf8).str.zfill(9)).alias("traj_id")
        site = (t % 4).replace_strict({0: "shop", 1: "travel", 2: "wiki", 3: "mail"})
        steps = pl.DataFrame(
            {
                "traj_id": traj,
                "step_idx": i % STEPS_PER_TRAJ,
                "url": "http://" + site + ".localhost:8001/search?q=item" + (i % 997).cast(pl.Utf8),
                "title": site + " — results page " + (i % 13).cast(pl.Utf8),
                "screenshot_hash": i.cast(pl.Utf8).map_elements(
                    lambda v: f"{hash(('s', v)) & (2**256 - 1):064x}", return_dtype=pl.Utf8
                ),
                "a11y_hash": i.cast(pl.Utf8).map_elements(
                    lambda v: f"{hash(('a', v)) & (2**256 - 1):064x}", return_dtype=pl.Utf8
                ),
                "model_output": "Thought: the search results list the item I need; the cheapest "
                "option is in row " + (i % 7).cast(pl.Utf8) + ", so I will open it and check the "
                "variants before adding it to the cart. Action: click("
                + (i % 1280).cast(pl.Utf8)
                + ", "
                + (i % 800).cast(pl.Utf8)
                + ")",
                "action": '{"type": "click", "x": '
                + (i % 1280).cast(pl.Utf8)
                + ', "y": '
                + (i % 800).cast(pl.Utf8)
                + "}",
                "action_text": "click("
                + (i % 1280).cast(pl.Utf8)
                + ", "
                + (i % 800).cast(pl.Utf8)
                + ")",
                "latency_model_s": (i % 100).cast(pl.Float64) / 50,
                "latency_env_s": (i % 30).cast(pl.Float64) / 100,
            }
        )
        tids = steps["traj_id"].unique(maintain_order=True)
        trajs = pl.DataFrame(
            {
                "traj_id": tids,
                "run_id": ["bench-run"] * per,
                "task_id": [f"task-{k % 500}" for k in range(per)],
                "policy": ["expert"] * per,
                "status": ["success" if k % 3 else "failure" for k in range(per)],
                "n_steps": [STEPS_PER_TRAJ] * per,
                "duration_s": [12.5] * per,
            }
        )
        out.append((conform(Trajectory, trajs), conform(Step, steps)))
    return out


def ingest_lake(data, home: Path) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all threads) to write ``data`` into a new DuckLake."""
    wh = Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""))
    start, cpu = time.perf_counter(), time.process_time()
    for k, (trajs, steps) in enumerate(data, 1):
        wh.write_trajectories(trajs, steps)
        if k % 200 == 0:
            rate = k * steps.height / (time.perf_counter() - start)
            print(f"  ducklake: {k * steps.height:>9,} steps  {rate:,.0f} steps/s", flush=True)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    check_counts("DuckLake", data, wh.count(Trajectory), wh.count(Step))
    wh.close()
    return elapsed, cpu


def ingest_plain(data, path: Path) -> tuple[float, float]:
    """The same rows, in the same transactions (trajectories + steps each), into a DuckDB file."""
    con = duckdb.connect(str(path))
    for migration in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql")):  # the same tables
        con.execute(migration.read_text())
    start, cpu = time.perf_counter(), time.process_time()
    for trajs, steps in data:
        con.register("__bench_trajs", trajs.to_arrow())
        con.register("__bench_steps", steps.to_arrow())
        con.execute("BEGIN")
        con.execute("INSERT INTO trajectories BY NAME SELECT * FROM __bench_trajs")
        con.execute("INSERT INTO steps BY NAME SELECT * FROM __bench_steps")
        con.execute("COMMIT")
        con.unregister("__bench_trajs")
        con.unregister("__bench_steps")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    n_trajs = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    n_steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
    check_counts("plain DuckDB", data, n_trajs, n_steps)
    con.close()
    return elapsed, cpu


def check_counts(store: str, data, n_trajs: int, n_steps: int) -> None:
    """Fail loudly unless the store holds every row the benchmark wrote (no silent no-op)."""
    want_trajs = sum(t.height for t, _ in data)
    want_steps = sum(s.height for _, s in data)
    print(
        f"rows in {store}: {n_steps:,} steps / {n_trajs:,} trajectories "
        f"(expected {want_steps:,} / {want_trajs:,})",
        flush=True,
    )
    if (n_trajs, n_steps) != (want_trajs, want_steps):
        raise SystemExit(
            f"{store}: ingested {n_steps} steps / {n_trajs} trajectories, "
            f"expected {want_steps} / {want_trajs}"
        )


def time_query(wh: Warehouse, name: str, repeats: int = 5) -> float:
    wh.query(name)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wh.query(name)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--big-batch", type=int, default=5_000)
    ap.add_argument("--big-steps", type=int, default=200_000)
    ap.add_argument("--results", type=Path, help="results file (default: bench/results/)")
    ap.add_argument(
        "--quick", action="store_true", help="20k steps, 10k for big batches: a few seconds"
    )
    args = ap.parse_args()
    if args.quick:
        args.steps, args.big_steps = 20_000, 10_000
    big_n = min(args.steps, args.big_steps)
    for n, b in ((args.steps, args.batch), (big_n, args.big_batch)):
        if b % STEPS_PER_TRAJ or n % b:
            ap.error(f"{n:,} steps do not split into transactions of {b:,} whole trajectories")
    load_start = os.getloadavg()[0]
    print(f"generating {args.steps:,} step rows in transactions of {args.batch:,} …", flush=True)
    data = batches(args.steps, args.batch)
    with tempfile.TemporaryDirectory(prefix="webloop-bench-") as tmp:
        home = Path(tmp) / "home"
        lake_s, lake_cpu = ingest_lake(data, home)
        plain_s, plain_cpu = ingest_plain(data, Path(tmp) / "plain.duckdb")
        with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
            summary = time_query(wh, "trajectory_summary")
            success = time_query(wh, "success_by")
        big_s, big_cpu = ingest_lake(batches(big_n, args.big_batch), Path(tmp) / "big")
    load_end = os.getloadavg()[0]
    n = args.steps
    lake_rate, plain_rate = n / lake_s, n / plain_s
    print()
    print(f"{'':40s}{'steps/s':>10s}  {'wall':>8s}  {'CPU':>8s}")
    for name, steps, wall, cpu in (
        (f"ingest, DuckLake, {args.batch:,}-step txns:", n, lake_s, lake_cpu),
        (f"ingest, plain DuckDB, {args.batch:,}-step txns:", n, plain_s, plain_cpu),
        (f"ingest, DuckLake, {args.big_batch:,}-step txns:", big_n, big_s, big_cpu),
    ):
        print(f"{name:40s}{steps / wall:>10,.0f}  {wall:>7.1f}s  {cpu:>7.1f}s  ({steps:,} steps)")
    print(f"ratio DuckLake / plain DuckDB (wall): {lake_rate / plain_rate:.2f}")
    print(f"trajectory_summary over {n:,} steps: {summary * 1000:.1f} ms (median of 5)")
    print(f"success_by over {n:,} steps: {success * 1000:.1f} ms (median of 5)")
    print(
        f"load average (1 min): {load_start:.2f} at start, {load_end:.2f} at end, "
        f"{os.cpu_count()} CPUs (CPU = this process, all threads)"
    )


if __name__ == "__main__":
    from bench.results import run_main

    run_main("warehouse", main)
