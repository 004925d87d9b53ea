"""The demo flow: create the warehouse, generate the bundled task suite, load the generated
trajectory sample, summarize it through SQL.

This is the main job of ``make demo`` at this stage; later stages (collect → judge → curate →
train → evaluate) extend it into the full flywheel.
"""

from __future__ import annotations

from typing import Any

from flows import prefect_env

prefect_env.configure()

from prefect import flow, task  # noqa: E402

from sites.tasks import generate as generate_tasks  # noqa: E402
from warehouse import Warehouse, WarehouseConfig, migrations, sample  # noqa: E402
from warehouse.tasks import put_tasks  # noqa: E402


@task(retries=2, retry_delay_seconds=1)
def prepare_warehouse(home: str | None) -> dict[str, Any]:
    """Create or upgrade the warehouse; return where it lives and its schema version."""
    cfg = WarehouseConfig.from_env(home=home)
    with Warehouse.open(cfg) as wh:
        return {"catalog": cfg.describe(), "schema_version": migrations.current_version(wh.con)}


@task(retries=2, retry_delay_seconds=1)
def load_sample(home: str | None, seed: int, n_tasks: int, samples: int) -> dict[str, int]:
    """Generate the sample and write it (idempotent: a re-run adds nothing)."""
    data = sample.generate(seed=seed, n_tasks=n_tasks, samples=samples)
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        written = sample.load(wh, data)
    return {
        "tasks": len(data.tasks),
        "trajectories": len(data.trajectories),
        "steps": len(data.steps),
        "screenshots": len(data.screenshots),
        "rows_inserted": written.inserted,
    }


@task(retries=2, retry_delay_seconds=1)
def generate_bundled_tasks(home: str | None, n: int, seed: int) -> dict[str, int]:
    """The bundled suite (rubrics, checkers, reference solutions) into the warehouse."""
    tasks = generate_tasks(n, seed)
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        rep = put_tasks(wh, tasks)
    by_split: dict[str, int] = {}
    for t in tasks:
        by_split[t.split or "?"] = by_split.get(t.split or "?", 0) + 1
    return {"generated": len(tasks), "new": len(rep.new), **by_split}


@task
def summarize(home: str | None) -> list[dict[str, Any]]:
    """Success by suite/site/split/policy, through the warehouse's SQL query."""
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        return wh.query("success_by").to_dicts()


@flow(name="demo", log_prints=True)
def demo_flow(
    home: str | None = None,
    seed: int = 0,
    n_tasks: int = 12,
    samples: int = 2,
    bundled_tasks: int = 200,
) -> dict[str, Any]:
    """Create the warehouse, generate bundled tasks, load the demo sample, summarize."""
    where = prepare_warehouse(home)
    suite = generate_bundled_tasks(home, bundled_tasks, seed)
    loaded = load_sample(home, seed, n_tasks, samples)
    return {"warehouse": where, "bundled": suite, "loaded": loaded, "summary": summarize(home)}
