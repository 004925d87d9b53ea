"""The ``webloop`` command line. Heavy imports (prefect, flows) happen inside the commands."""

from __future__ import annotations

import datetime as dt
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from warehouse import Warehouse, WarehouseConfig
from warehouse.config import ConfigError

app = typer.Typer(
    help="webloop: the open data flywheel for visual web agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
warehouse_app = typer.Typer(help="Inspect and maintain the trajectory warehouse.")
import_app = typer.Typer(help="Import trajectories from other formats.")
export_app = typer.Typer(help="Export trajectories to other formats.")
app.add_typer(warehouse_app, name="warehouse")
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")

console = Console()
err = Console(stderr=True)


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


class UserError(Exception):
    """An error caused by input; printed without a traceback."""


@app.callback()
def _root(
    home: Annotated[
        Path | None, typer.Option(help="Data directory (default $WEBLOOP_HOME or ./.webloop).")
    ] = None,
) -> None:
    if home is not None:
        os.environ["WEBLOOP_HOME"] = str(home)


def _open(*, read_only: bool = False) -> Warehouse:
    return Warehouse.open(WarehouseConfig.from_env(), read_only=read_only)


def print_frame(df: Any, fmt: Format = Format.table, title: str | None = None) -> None:
    """Print a polars frame as a rich table, CSV or JSON rows."""
    if fmt is Format.csv:
        sys.stdout.write(df.write_csv())
    elif fmt is Format.json:
        sys.stdout.write(df.write_json() + "\n")
    else:
        table = Table(title=title, show_lines=False)
        for name in df.columns:
            table.add_column(name, overflow="fold")
        for row in df.iter_rows():
            table.add_row(*("" if v is None else str(v) for v in row))
        console.print(table)


# -- sql --------------------------------------------------------------------------------------

_READ_ONLY_TYPES = {"SELECT", "EXPLAIN"}


def statement_kinds(query: str) -> list[str]:
    """The statement types in ``query`` (DuckDB's parser), e.g. ``["SELECT", "INSERT"]``."""
    import duckdb

    try:
        return [s.type.name for s in duckdb.connect().extract_statements(query)]
    except duckdb.Error as exc:
        raise UserError(f"cannot parse the query: {exc}") from None


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over the warehouse tables (schema 'lake').")],
    write: Annotated[
        bool, typer.Option("--write", help="Allow statements that change data.")
    ] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Run SQL against the warehouse; read-only unless --write."""
    kinds = statement_kinds(query)
    if not kinds:
        raise UserError("the query is empty")
    writes = [k for k in kinds if k not in _READ_ONLY_TYPES]
    if "EXPLAIN" in kinds and "ANALYZE" in query.upper():
        writes.append("EXPLAIN ANALYZE")
    if writes and not write:
        raise UserError(
            f"refusing to run a {', '.join(writes)} statement without --write "
            "(webloop sql is read-only by default)"
        )
    with _open(read_only=not write) as wh:
        result = None
        statements = wh.con.extract_statements(query)
        for stmt in statements:
            result = wh.con.execute(stmt)
        if result is not None and result.description:
            print_frame(result.pl(), fmt)
        elif fmt is Format.table:
            console.print(f"ok ({len(statements)} statement(s))")


# -- warehouse --------------------------------------------------------------------------------


@warehouse_app.command("info")
def warehouse_info(
    fmt: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """Counts per table, snapshots, pinned versions, sizes."""
    from warehouse import info

    with _open() as wh:
        report = info.collect(wh)
    if fmt is not Format.table:
        import json

        sys.stdout.write(json.dumps(report, default=str, indent=2) + "\n")
        return
    console.print(f"[bold]catalog[/bold]  {report['catalog']}")
    console.print(f"[bold]data[/bold]     {report['data_path']}")
    console.print(f"[bold]blobs[/bold]    {report['blob_path']}")
    console.print(
        f"schema version {report['schema_version']}, snapshots {report['snapshots']} "
        f"(latest {report['latest_snapshot']}), pinned {report['pinned'] or 'none'}"
    )
    console.print(
        f"data files {report['data_files']} ({_size(report['data_bytes'])}), "
        f"blobs {report['blob_count']} ({_size(report['blob_bytes'])})"
    )
    import polars as pl

    print_frame(pl.DataFrame(report["tables"]), title="rows per table")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@warehouse_app.command("maintain")
def warehouse_maintain(
    keep_recent_minutes: Annotated[
        float, typer.Option(help="Also keep snapshots younger than this (readers may use them).")
    ] = 60.0,
) -> None:
    """Flush inlined data, merge small files, expire unpinned snapshots, delete unused files."""
    from warehouse import versions

    with _open() as wh:
        rep = versions.maintain(wh, keep_recent=dt.timedelta(minutes=keep_recent_minutes))
    console.print(
        f"data files {rep.files_before} -> {rep.files_after}; "
        f"expired {len(rep.snapshots_expired)} snapshot(s); "
        f"kept pinned {rep.snapshots_kept_pinned or 'none'}; deleted {rep.files_deleted} file(s)"
    )


@warehouse_app.command("attach-sql")
def warehouse_attach_sql() -> None:
    """Print the SQL that opens this warehouse from any DuckDB client."""
    from warehouse import info

    sys.stdout.write(info.attach_sql(WarehouseConfig.from_env()))


# -- import / export --------------------------------------------------------------------------


@import_app.command("om2w")
def import_om2w(
    folder: Annotated[Path, typer.Argument(help="Folder of Online-Mind2Web task folders.")],
    labels: Annotated[
        Path | None, typer.Option(help="human_label.json (0 failure, 1 success, 2 not executable)")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Run name (default: from the folder).")] = None,
    agent: Annotated[
        str | None, typer.Option(help="Agent name: the policy, and the label column to use.")
    ] = None,
) -> None:
    """Import Online-Mind2Web trajectories (result.json + trajectory/ screenshots)."""
    from warehouse.interop import om2w

    with _open() as wh:
        rep = om2w.import_om2w(wh, folder, labels=labels, run_name=run, agent=agent)
    console.print(f"run {rep.run_id}: imported {len(rep.imported)} trajectories")
    if labels:
        console.print(f"human labels written: {rep.labels_written}")
    for problem in rep.label_problems:
        err.print(f"[yellow]label skipped[/yellow]: {problem}")
    for name, reason in rep.malformed:
        err.print(f"[yellow]malformed[/yellow] {name}: {reason}")


@export_app.command("om2w")
def export_om2w(
    out: Annotated[Path, typer.Argument(help="Output folder.")],
    run: Annotated[str, typer.Option(help="The run whose trajectories to export.")],
) -> None:
    """Export a run's trajectories in Online-Mind2Web's layout (for its evaluators)."""
    from warehouse.interop import om2w

    with _open(read_only=True) as wh:
        rep = om2w.export_om2w(wh, run, out)
    console.print(f"wrote {len(rep.folders)} task folder(s) under {out}")


# -- demo -------------------------------------------------------------------------------------


@app.command()
def demo(
    seed: Annotated[int, typer.Option(help="Seed of the generated sample.")] = 0,
    n_tasks: Annotated[int, typer.Option(help="Tasks in the sample.")] = 12,
    samples: Annotated[int, typer.Option(help="Trajectories per task.")] = 2,
) -> None:
    """The main job: run the demo flow (warehouse + sample + SQL summary) through Prefect."""
    console.print("[bold]webloop demo[/bold]: starting the Prefect flow 'demo' …")
    from flows.demo import demo_flow

    out = demo_flow(home=None, seed=seed, n_tasks=n_tasks, samples=samples)
    where, loaded = out["warehouse"], out["loaded"]
    console.print(f"warehouse: {where['catalog']} (schema v{where['schema_version']})")
    console.print(
        f"sample: {loaded['tasks']} tasks, {loaded['trajectories']} trajectories, "
        f"{loaded['steps']} steps, {loaded['screenshots']} screenshots "
        f"({loaded['rows_inserted']} new rows)"
    )
    import polars as pl

    print_frame(pl.DataFrame(out["summary"]), title="success by suite / site / split / policy")
    console.print(
        'next: webloop sql "SELECT * FROM trajectories LIMIT 5"  ·  webloop warehouse info'
    )


def main() -> None:
    """Console entry point: expected errors print one line and exit 2, without a traceback."""
    import duckdb

    from warehouse.blobs import BlobError
    from warehouse.connection import WarehouseError

    try:
        app()
    except (UserError, WarehouseError, BlobError, ConfigError, duckdb.Error) as exc:
        err.print(f"[red]error[/red]: {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
