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
"""

from __future__ import annotations

import argparse
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


def ingest_lake(data, home: Path) -> float:
    wh = Warehouse.open(WarehouseConfig.from_env(home=home, warehouse=""))
    start = time.perf_counter()
    for k, (trajs, steps) in enumerate(data, 1):
        wh.write_trajectories(trajs, steps)
        if k % 200 == 0:
            rate = k * steps.height / (time.perf_counter() - start)
            print(f"  ducklake: {k * steps.height:>9,} steps  {rate:,.0f} steps/s", flush=True)
    elapsed = time.perf_counter() - start
    wh.close()
    return elapsed


def ingest_plain(data, path: Path) -> float:
    con = duckdb.connect(str(path))
    con.execute((SCHEMA_DIR / "0001_init.sql").read_text())
    start = time.perf_counter()
    for _trajs, _steps in data:
        con.execute("BEGIN")
        con.execute("INSERT INTO trajectories SELECT * FROM trajs")
        con.execute("INSERT INTO steps SELECT * FROM steps")
        con.execute("COMMIT")
    elapsed = time.perf_counter() - start
    con.close()
    return elapsed


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
    args = ap.parse_args()
    print(f"generating {args.steps:,} step rows in transactions of {args.batch:,} …", flush=True)
    data = batches(args.steps, args.batch)
    with tempfile.TemporaryDirectory(prefix="webloop-bench-") as tmp:
        home = Path(tmp) / "home"
        lake_s = ingest_lake(data, home)
        plain_s = ingest_plain(data, Path(tmp) / "plain.duckdb")
        with Warehouse.open(WarehouseConfig.from_env(home=home, warehouse="")) as wh:
            assert wh.sql("SELECT count(*) FROM steps").item() == args.steps
            summary = time_query(wh, "trajectory_summary")
            success = time_query(wh, "success_by")
        big_n = min(args.steps, 200_000)
        big_s = ingest_lake(batches(big_n, args.big_batch), Path(tmp) / "big")
    lake_rate, plain_rate = args.steps / lake_s, args.steps / plain_s
    print()
    print(f"ingest, DuckLake (SQLite catalog):  {lake_rate:>10,.0f} steps/s  ({lake_s:.1f} s)")
    print(f"ingest, plain DuckDB file baseline: {plain_rate:>10,.0f} steps/s  ({plain_s:.1f} s)")
    print(f"ratio DuckLake / plain DuckDB:      {lake_rate / plain_rate:>10.2f}")
    print(f"trajectory_summary over {args.steps:,} steps: {summary * 1000:8.1f} ms (median of 5)")
    print(f"success_by over {args.steps:,} steps:         {success * 1000:8.1f} ms (median of 5)")
    print(
        f"ingest, DuckLake, {args.big_batch:,}-step transactions ({big_n:,} steps): "
        f"{big_n / big_s:,.0f} steps/s"
    )


if __name__ == "__main__":
    main()
