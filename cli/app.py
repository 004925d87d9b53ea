"""The ``webloop`` command line. Heavy imports (prefect, flows) happen inside the commands."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from cli.common import (
    Format,
    FormatOption,
    _open,
    console,
    err,
    existing_run,
    fit_consoles,
    print_frame,
)
from cli.help import polish
from cli.options import config_command
from stages.maintain import MaintainConfig
from stages.plugins import load_plugins
from warehouse import WarehouseConfig
from warehouse.config import ConfigError
from warehouse.secrets import has_url_credentials, redact

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
sites_app = typer.Typer(help="The bundled local websites.")
tasks_app = typer.Typer(help="Task suites: generate, import, list.")
tasks_import_app = typer.Typer(help="Import tasks from other benchmarks' formats.")
app.add_typer(sites_app, name="sites")
app.add_typer(tasks_app, name="tasks")
tasks_app.add_typer(tasks_import_app, name="import")


class Coords(StrEnum):
    pixels = "pixels"
    norm1000 = "norm1000"


class PromptMode(StrEnum):
    screenshot = "screenshot"
    a11y = "a11y"
    both = "both"


# The Dask scale-out options of collect, judge and score-steps (flows/dask_scale.py shards).
Workers = Annotated[
    int,
    typer.Option(
        help="Shard across a local Dask cluster of N worker processes (0: no Dask).",
        min=0,
        max=1024,
    ),
]
DaskAddress = Annotated[
    str | None, typer.Option(help="Shard across an existing Dask cluster (tcp://HOST:8786).")
]


class Selection(StrEnum):
    model = "model"
    heuristic = "heuristic"


class Rule(StrEnum):
    unanimous = "unanimous"
    majority = "majority"
    threshold = "threshold"


@app.callback()
def _root(
    home: Annotated[
        Path | None, typer.Option(help="Data directory (default $WEBLOOP_HOME or ./.webloop).")
    ] = None,
) -> None:
    if home is not None:
        os.environ["WEBLOOP_HOME"] = str(home)


# -- sql --------------------------------------------------------------------------------------


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over the warehouse tables (schema 'lake').")],
    write: Annotated[
        bool,
        typer.Option("--write", help="Allow data changes (INSERT, UPDATE, DELETE, MERGE)."),
    ] = False,
    schema: Annotated[
        bool,
        typer.Option(
            "--schema", help="With --write, also allow CREATE, DROP and ALTER (schema changes)."
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, max=86_400, help="Stop the query after this many seconds."),
    ] = 120.0,
    fmt: FormatOption = Format.table,
) -> None:
    """Run SQL against the warehouse; read-only unless --write (an allow-list: see Security).

    Every write is a DuckLake snapshot: `webloop warehouse rollback SNAPSHOT` undoes one."""
    if schema and not write:
        raise ConfigError("--schema changes the warehouse: pass it together with --write")
    from warehouse.sandbox import SqlInterruptedError, open_sandboxed, run_user_sql
    from warehouse.versions import current_snapshot

    # Sandboxed: the warehouse's tables only (no other files, network, extensions or settings);
    # read-only opens create, migrate and write nothing.
    with open_sandboxed(WarehouseConfig.from_env(), write=write) as wh:
        before = current_snapshot(wh) if write else None
        notice = threading.Timer(
            2.0,
            lambda: sys.stderr.write(
                f"still running after 2 s (Ctrl-C stops it; so does --timeout, now {timeout:g} s)\n"
            ),
        )
        notice.daemon = True
        notice.start()
        try:
            frame, n_statements = run_user_sql(
                wh.con, query, write=write, schema=schema, timeout_s=timeout
            )
        except SqlInterruptedError as exc:
            sys.stderr.write(f"{exc}\n")
            raise typer.Exit(130) from None
        finally:
            notice.cancel()
        if frame is not None:
            print_frame(frame, fmt)
        elif fmt is Format.table:
            console.print(f"ok ({n_statements} statement(s))")
        if write and fmt is Format.table and (after := current_snapshot(wh)) != before:
            console.print(f"snapshot {after}; undo with: webloop warehouse rollback {before}")


# -- warehouse --------------------------------------------------------------------------------


@warehouse_app.command("info")
def warehouse_info(
    fmt: FormatOption = Format.table,
) -> None:
    """Where catalog, data files and blobs live and whether each answers; counts per table,
    snapshots, pinned versions, sizes. Exits 1 when the data path or blob store does not answer."""
    from warehouse import info

    with _open(read_only=True) as wh:  # creates, migrates and writes nothing
        report = info.collect(wh)
    failed = [k for k, v in report["checks"].items() if v != "ok"]
    if fmt is not Format.table:
        import json

        sys.stdout.write(json.dumps(report, default=str, indent=2) + "\n")
        raise typer.Exit(1 if failed else 0)
    for label, key, check in (
        ("catalog", "catalog", "catalog"),
        ("data", "data_path", "data"),
        ("blobs", "blob_path", "blobs"),
    ):
        state = report["checks"][check]
        mark = "[green]ok[/green]" if state == "ok" else f"[red]{escape(state)}[/red]"
        console.print(f"[bold]{label:<8}[/bold] {escape(str(report[key]))}  {mark}")
    console.print(
        f"schema version {report['schema_version']}, snapshots {report['snapshots']} "
        f"(latest {report['latest_snapshot']}), pinned {report['pinned'] or 'none'}"
    )
    blobs = (
        f"blobs {report['blob_count']} ({_size(report['blob_bytes'])})"
        if report["blob_count"] is not None
        else "blobs: not counted (the store did not answer)"
    )
    console.print(f"data files {report['data_files']} ({_size(report['data_bytes'])}), {blobs}")
    from warehouse.frames import rows_frame

    print_frame(rows_frame(report["tables"]), title="rows per table")
    if failed:
        raise typer.Exit(1)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@warehouse_app.command("rollback")
def warehouse_rollback(
    snapshot: Annotated[
        int, typer.Argument(min=1, help="The snapshot to restore (see FROM lake.snapshots()).")
    ],
) -> None:
    """Restore every table as it was at SNAPSHOT, as one new snapshot (itself undoable)."""
    from warehouse import Warehouse
    from warehouse.rollback import rollback

    # No migrations first: after a DROP SCHEMA they would recreate empty tables before the
    # rollback restores the real ones (an extra snapshot to undo to).
    with Warehouse.open(WarehouseConfig.from_env(), migrate=False) as wh:
        rep = rollback(wh, snapshot)
    for t in rep.tables:
        rows = "" if t.rows_after is None else f": {t.rows_before} -> {t.rows_after} rows"
        console.print(f"{escape(t.table)}  {t.action}{rows}")
    console.print(
        f"restored snapshot {rep.target} as snapshot {rep.snapshot}; "
        f"undo with: webloop warehouse rollback {rep.previous}"
    )


def warehouse_maintain(cfg: MaintainConfig) -> None:
    """Flush inlined data, merge small files, expire unpinned snapshots, delete unused files."""
    from stages.maintain import run_maintain

    with _open() as wh:
        rep = run_maintain(wh, cfg).report
    console.print(
        f"data files {rep.files_before} -> {rep.files_after}; "
        f"expired {len(rep.snapshots_expired)} snapshot(s); "
        f"kept pinned {rep.snapshots_kept_pinned or 'none'}; "
        f"deleted {rep.files_deleted} file(s)"
    )


config_command(
    warehouse_app,
    "maintain",
    MaintainConfig,
    warehouse_maintain,
    help=warehouse_maintain.__doc__,
)


@warehouse_app.command("copy")
def warehouse_copy(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The destination catalog: a postgresql:// URL (a team's; its password in "
            "PGPASSWORD, not on the command line) or a SQLite path.",
        ),
    ],
    data_path: Annotated[
        str,
        typer.Option(
            help="Where the copy's data files go (a folder or s3://bucket/prefix/; not the "
            "source's: maintenance of either catalog would delete the other's files)."
        ),
    ],
    blobs: Annotated[
        str | None,
        typer.Option(
            help="Where the copy's blobs go (default: where they are now; blobs are "
            "content-addressed and never deleted, so two catalogs may share them)."
        ),
    ] = None,
) -> None:
    """Copy this warehouse (every snapshot, data file and blob) to another catalog, data path
    and blob store, e.g. from a laptop's SQLite to a team's PostgreSQL and S3. The source is
    only read; re-running resumes; the copy is verified by rows per table at every pinned
    snapshot and by blob hashes."""
    from warehouse.copy import copy_warehouse

    src = WarehouseConfig.from_env()
    dst = WarehouseConfig.from_env(
        home=src.home,
        warehouse=to,
        data_path=data_path,
        blob_path=blobs or src.blob_path,
    )
    rep = copy_warehouse(src, dst, progress=lambda m: console.print(escape(m)))
    if rep.nothing_to_do:
        console.print(f"nothing to do: {dst.describe()} already holds this warehouse")
        return
    console.print(
        f"copied to {escape(dst.describe())}: {rep.files_copied} data files "
        f"({rep.files_present} already there), {rep.blobs_copied} blobs "
        f"({rep.blobs_present} already there), catalog {rep.catalog}; snapshots up to "
        f"{rep.snapshots}, pinned {rep.pinned or 'none'}"
    )
    console.print(
        "use it with: WEBLOOP_WAREHOUSE=<the URL> "
        f"WEBLOOP_DATA_PATH={escape(dst.data_path)} WEBLOOP_BLOBS={escape(dst.blob_path)}"
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
    from rich.markup import escape

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
    rejected = rep.rejected_by_folder()
    if rejected:
        console.print(
            f"screenshots rejected (not stored; their steps keep no screenshot): "
            f"{len(rep.rejected)} in {len(rejected)} folder(s)"
        )
    for name, files in rejected.items():
        err.print(f"[yellow]rejected[/yellow] {escape(name)}: {len(files)} screenshot(s)")
        for file, reason in files:
            err.print(f"  {file}: {reason}", markup=False, highlight=False)


class OM2WSchema(StrEnum):
    v2 = "v2"
    v1 = "v1"


@export_app.command("om2w")
def export_om2w(
    out: Annotated[Path, typer.Argument(help="Output folder.")],
    run: Annotated[str, typer.Option(help="The run whose trajectories to export.")],
    schema: Annotated[
        OM2WSchema,
        typer.Option(help="v2 (schema_version online-mind2web-v2, what the judge reads) or v1."),
    ] = OM2WSchema.v2,
) -> None:
    """Export a run's trajectories in Online-Mind2Web's layout (for its evaluators)."""
    from warehouse.interop import om2w

    with _open(read_only=True) as wh:
        rep = om2w.export_om2w(wh, run, out, schema=schema.value)
    console.print(f"wrote {len(rep.folders)} task folder(s) ({rep.schema}) under {out}")
    for traj_id, reason in rep.skipped:
        err.print(f"[yellow]skipped[/yellow] {traj_id}: {reason}", highlight=False)
    if rep.skipped and not rep.folders:
        raise typer.Exit(1)


# -- sites / tasks ----------------------------------------------------------------------------


@sites_app.command("serve")
def sites_serve(
    seed: Annotated[
        int, typer.Option(help="Content seed (tasks must use the same).", min=0, max=2**32 - 1)
    ] = 0,
    base_port: Annotated[
        int,
        typer.Option(
            help="Ports base..base+3 for shop, travel, wiki, mail (0: free).", min=0, max=65535
        ),
    ] = 0,
) -> None:
    """Serve the bundled sites until Ctrl-C; print their URLs."""
    import time

    from sites.server import SITES, SiteServer

    ports = {n: base_port + i for i, n in enumerate(SITES)} if base_port else None
    server = SiteServer(seed=seed, ports=ports).start()
    home = WarehouseConfig.from_env().home
    home.mkdir(parents=True, exist_ok=True)
    from sites.secret_files import write_secret_file

    secret_file = write_secret_file(home / "sites.secret", server.secret)  # 0600 from the start
    for name, url in server.urls.items():
        console.print(f"{name:7s} {url}")
    console.print(f"inspection secret in {secret_file} (header X-Webloop-Secret); Ctrl-C stops")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


def _generated(n: int, seed: int, **kw: Any) -> list[Any]:
    """Bundled tasks (``sites.tasks.generate``); an unknown suite version is a ConfigError."""
    from sites.tasks import SUITE_VERSIONS, generate

    if kw.get("version") not in SUITE_VERSIONS:
        raise ConfigError(f"--suite-version must be one of {list(SUITE_VERSIONS)}")
    return generate(n, seed, **kw)


@sites_app.command("check")
def sites_check(
    n: Annotated[
        int, typer.Option(help="Tasks to run the scripted expert on.", min=1, max=10_000_000)
    ] = 40,
    seed: Annotated[int, typer.Option(help="Task seed.", min=0, max=2**32 - 1)] = 0,
    concurrency: Annotated[int, typer.Option(help="Browser contexts at once.", min=1, max=256)] = 4,
    suite_version: Annotated[
        str, typer.Option(help="Bundled suite version (3: with the four headroom templates).")
    ] = "2",
) -> None:
    """Run the scripted expert on generated tasks in real Chromium; report the success rate."""
    import asyncio

    from sites.server import SiteServer
    from stages.bundled import run_expert

    tasks = _generated(n, seed, version=suite_version)
    done = []

    def progress(res: Any) -> None:
        done.append(res)
        if len(done) % 10 == 0 or len(done) == len(tasks):
            ok = sum(r.verdict.success for r in done)
            console.print(f"  {len(done)}/{len(tasks)} run, {ok} succeeded")

    with SiteServer(seed=0) as server:
        results = asyncio.run(run_expert(tasks, server, concurrency=concurrency, progress=progress))
    ok = sum(r.verdict.success for r in results)
    console.print(f"expert success: {ok}/{len(results)} ({ok / max(1, len(results)):.1%})")
    for r in results:
        if not r.verdict.success:
            err.print(f"[yellow]failed[/yellow] {r.task_id}: {r.error or r.verdict.reasons}")


@tasks_app.command("generate")
def tasks_generate(
    suite: Annotated[
        str, typer.Option(help="Task suite (only 'bundled' is generated).")
    ] = "bundled",
    n: Annotated[int, typer.Option(help="Number of distinct tasks.", min=1, max=10_000_000)] = 2000,
    seed: Annotated[
        int, typer.Option(help="Seed: the same seed gives the same tasks.", min=0, max=2**32 - 1)
    ] = 0,
    site_seed: Annotated[
        int, typer.Option(help="Content seed of the sites.", min=0, max=2**32 - 1)
    ] = 0,
    ood_site: Annotated[str, typer.Option(help="Site held out as the 'ood' split.")] = "travel",
    adversarial: Annotated[
        bool,
        typer.Option(help="Also write prompt-injection variants (suite bundled-adversarial)."),
    ] = False,
    suite_version: Annotated[
        str, typer.Option(help="Bundled suite version (3: with the four headroom templates).")
    ] = "2",
) -> None:
    """Generate bundled tasks (rubric, checker, reference solution) into the warehouse."""
    from sites.server import SITES
    from sites.tasks import adversarial_variants
    from warehouse.tasks import put_tasks

    if suite != "bundled":
        raise ConfigError(f"only the 'bundled' suite is generated; import others (got {suite!r})")
    if ood_site not in SITES:
        raise ConfigError(f"--ood-site must be one of {sorted(SITES)}")
    tasks = _generated(n, seed, site_seed=site_seed, ood_site=ood_site, version=suite_version)
    if adversarial:
        tasks += adversarial_variants(tasks)
    with _open() as wh:
        rep = put_tasks(wh, tasks)
    console.print(
        f"{len(tasks)} tasks: {len(rep.new)} new, {len(rep.new_version)} new versions, "
        f"{len(rep.unchanged)} unchanged"
    )
    from warehouse.frames import rows_frame

    counts = Counter((t.suite, t.site, t.split) for t in tasks)
    columns = ("suite", "site", "split", "len")
    rows = [dict(zip(columns, (*key, n), strict=True)) for key, n in sorted(counts.items())]
    print_frame(rows_frame(rows), title="tasks by site and split")


@tasks_import_app.callback(invoke_without_command=False)
def _tasks_import() -> None:
    """Import tasks: om2w, webvoyager or rubric files."""


AllowPrivate = Annotated[
    bool,
    typer.Option(
        help="Admit start URLs on loopback and private hosts (your own intranet or local sites); "
        "link-local and cloud-metadata hosts stay refused.",
    ),
]


def _import_tasks(fmt: str, file: Path, allow_private: bool = False) -> None:
    from warehouse.interop.task_formats import parse_task_file
    from warehouse.tasks import put_tasks

    parsed = parse_task_file(fmt, file, allow_private=allow_private)
    for n, reason in parsed.errors:
        at = f"{file}:{n}" if parsed.unit == "line" else f"{file} entry {n}"
        err.print(f"[yellow]skipped[/yellow] {escape(f'{at}: {reason}')}")
    if not parsed.tasks:
        raise ConfigError(f"{file}: no {fmt} task could be read (see the skipped rows above)")
    with _open() as wh:
        rep = put_tasks(wh, parsed.tasks)
    console.print(
        f"{len(parsed.tasks)} tasks read: {len(rep.new)} new, "
        f"{len(rep.new_version)} new versions, {len(rep.unchanged)} unchanged"
        + (f"; {len(parsed.errors)} row(s) skipped" if parsed.errors else "")
    )


@tasks_import_app.command("om2w")
def tasks_import_om2w(
    file: Annotated[Path, typer.Argument(help="Online-Mind2Web tasks JSON.")],
    allow_private: AllowPrivate = False,
) -> None:
    """Online-Mind2Web tasks (task_id, confirmed_task, website, reference_length, level)."""
    _import_tasks("om2w", file, allow_private)


@tasks_import_app.command("webvoyager")
def tasks_import_webvoyager(
    file: Annotated[Path, typer.Argument(help="WebVoyager JSONL.")],
    allow_private: AllowPrivate = False,
) -> None:
    """WebVoyager tasks (JSONL: web_name, id, ques, web)."""
    _import_tasks("webvoyager", file, allow_private)


@tasks_import_app.command("rubric")
def tasks_import_rubric(
    file: Annotated[Path, typer.Argument(help="Rubric tasks JSON/JSONL.")],
    allow_private: AllowPrivate = False,
) -> None:
    """Rubric tasks (instruction, start_url, rubric list, optional reference)."""
    _import_tasks("rubric", file, allow_private)


@tasks_app.command("list")
def tasks_list(
    suite: Annotated[str | None, typer.Option()] = None,
    site: Annotated[str | None, typer.Option()] = None,
    split: Annotated[str | None, typer.Option()] = None,
    difficulty: Annotated[
        int | None, typer.Option(help="Exact difficulty.", min=0, max=100)
    ] = None,
    min_difficulty: Annotated[int | None, typer.Option(min=0, max=100)] = None,
    max_difficulty: Annotated[int | None, typer.Option(min=0, max=100)] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.", min=1)] = 50,
    fmt: FormatOption = Format.table,
) -> None:
    """List tasks (latest versions) with filters."""
    from warehouse.listings import matching_tasks

    with _open(read_only=True) as wh:
        df = matching_tasks(
            wh,
            suite=suite,
            site=site,
            split=split,
            difficulty=difficulty,
            min_difficulty=min_difficulty,
            max_difficulty=max_difficulty,
        )
    total = len(df)
    print_frame(df.head(limit), fmt)
    if fmt is Format.table:
        console.print(f"{total} task(s) match" + (f"; showing {limit}" if total > limit else ""))


# -- collect ----------------------------------------------------------------------------------


# -- judge ------------------------------------------------------------------------------------

judge_app = typer.Typer(help="Judge trajectories; calibrate judges against references.")
app.add_typer(judge_app, name="judge")


@judge_app.command("agreement")
def judge_agreement(
    judge_name: Annotated[str, typer.Option("--judge", help="The judge to calibrate.")],
    reference: Annotated[str, typer.Option(help="human, programmatic, or a judge name.")],
    fmt: FormatOption = Format.table,
) -> None:
    """Accuracy, precision/recall/F1, Cohen's kappa and success-rate gap, per site (stored)."""
    from judging.agreement import compute_agreements
    from warehouse.frames import rows_frame
    from warehouse.listings import judge_versions

    with _open() as wh:
        versions = judge_versions(wh, judge_name)
        if not versions:
            raise ConfigError(f"no judgments from judge {judge_name!r} (run: webloop judge)")
        rows = [r for v in versions for r in compute_agreements(wh, judge_name, reference, v)]
    if all(r.n == 0 for r in rows):
        raise ConfigError(
            f"no trajectories have both a {judge_name} verdict and a {reference} outcome"
        )
    columns = ("n", "accuracy", "precision", "recall", "f1", "kappa", "success_rate_gap")
    table = [
        {
            "judge_version": r.judge_version,
            "site": "(all)" if r.site is None else r.site,
            **{k: getattr(r, k) for k in columns},
        }
        for r in rows
    ]
    print_frame(rows_frame(table), fmt)


@judge_app.command("flips")
def judge_flips(
    judge_names: Annotated[
        list[str], typer.Option("--judge", help="Judge(s) to test (repeat the option).")
    ],
    reference: Annotated[str, typer.Option(help="Ground truth (default: the checker).")] = (
        "programmatic"
    ),
    fmt: FormatOption = Format.table,
) -> None:
    """Prompt-injection flip rates: reference failures a judge calls success, per injection."""
    from judging.adversarial import flip_rates
    from warehouse.frames import rows_frame

    with _open(read_only=True) as wh:
        rows = flip_rates(wh, judge_names, reference)
    if not rows:
        raise ConfigError(
            f"no {reference} failures judged by {', '.join(judge_names)} (collect on "
            "bundled-adversarial tasks or with --inject-answer, then run the judges)"
        )
    print_frame(rows_frame(rows), fmt)


# -- score-steps ------------------------------------------------------------------------------

score_app = typer.Typer(help="Process rewards: candidate actions at visited states, PRM scores.")
app.add_typer(score_app, name="score-steps")


@score_app.command("agreement")
def score_agreement(
    scorer: Annotated[str, typer.Option(help="The scorer to calibrate (e.g. vlm).")] = "vlm",
    reference: Annotated[str, typer.Option(help="The ground-truth scorer.")] = "exact",
    run: Annotated[
        str | None, typer.Option(help="Only trajectories of this run.", callback=existing_run)
    ] = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Pairwise ranking accuracy and top-1 agreement of a PRM with the exact scorer."""
    from stages.score_steps import scorer_agreement
    from warehouse.frames import rows_frame

    with _open(read_only=True) as wh:
        out = scorer_agreement(wh, scorer, reference, run)
    if not out["states"]:
        raise ConfigError(f"no states have candidates scored by both {scorer} and {reference}")
    print_frame(rows_frame([{"scorer": scorer, "reference": reference, **out}]), fmt)


# -- models -----------------------------------------------------------------------------------

models_app = typer.Typer(help="Models: build tiny offline models.")
app.add_typer(models_app, name="models")


@models_app.command("build-tiny")
def models_build_tiny(
    out: Annotated[Path, typer.Argument(help="Folder to write the checkpoint to.")],
    seed: Annotated[int, typer.Option(help="Initialization seed.", min=0, max=2**32 - 1)] = 0,
) -> None:
    """Build a tiny random Qwen2-VL (offline) for tests and CPU runs."""
    from training.models import build_tiny_vlm

    console.print(f"wrote {build_tiny_vlm(out, seed)}")


USAGE, RUNTIME = 2, 1


def exit_code(exc: BaseException) -> int:
    """2 for usage and bad input (unknown choice, bad SQL, malformed file, missing data the
    command needs), 1 for runtime failures (I/O, a crashed browser or server, a bug)."""
    from sites.secret_files import SecretFileError
    from warehouse.blobs import BlobCorruptError, BlobError, BlobNotFoundError
    from warehouse.connection import WarehouseError
    from warehouse.errors import is_bad_input, is_database_error

    if isinstance(exc, ConfigError | SecretFileError):
        return USAGE
    if is_database_error(exc):
        return USAGE if is_bad_input(exc) else RUNTIME
    if isinstance(exc, BlobCorruptError | BlobNotFoundError):
        return RUNTIME  # stored data is damaged or missing
    if isinstance(exc, BlobError):
        return USAGE  # e.g. not a sha256 digest
    if isinstance(exc, WarehouseError):
        cause = exc.__cause__ or exc.__context__
        if cause is not None and exit_code(cause) == RUNTIME and not isinstance(cause, KeyError):
            return RUNTIME  # e.g. the catalog cannot be opened: an I/O failure underneath
        return USAGE
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return USAGE  # a path given on the command line
    return RUNTIME


def _command() -> str:
    """The (sub)command the user ran, e.g. ``webloop tasks import om2w``."""
    words, cmd = ["webloop"], typer.main.get_command(app)
    args = iter(sys.argv[1:])
    for a in args:
        if a == "--home":
            next(args, None)
        if a.startswith("-"):
            continue
        sub = getattr(cmd, "commands", {}).get(a)  # a group's subcommands
        if sub is None:
            break
        words.append(a)
        cmd = sub
    return " ".join(words)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return first if len(text.splitlines()) == 1 else first + " …"


# Commands defined in their own modules (they import the helpers above).
from cli import (  # noqa: E402
    collect,
    components,
    curation,
    dashboard,
    deploy,
    flywheel,
    interventions,
    judge,
    score_steps,
    serving,
    training,
)

judge.register(judge_app)
score_steps.register(score_app)
for _group in (
    collect,
    components,
    curation,
    interventions,
    training,
    serving,
    deploy,
    flywheel,
    dashboard,
):
    _group.register(app)
polish(app)  # plain help, one-line summaries, examples (cli/help.py)


def main() -> None:
    """Console entry point. A failure prints one line and exits 2 (usage, bad input) or 1
    (runtime failure); the full traceback goes to the log file the line names."""
    from stages import logfile

    logfile.quiet_prefect_console()
    fit_consoles()
    try:
        _refuse_url_credentials(sys.argv[1:])
        load_plugins()
        app()
    except KeyboardInterrupt as exc:  # Ctrl-C outside a command
        _say_interrupted(exc)
        raise SystemExit(130) from None
    except SystemExit as exc:  # Typer turns a command's KeyboardInterrupt into exit 130
        interrupt = exc.__context__.__cause__ if exc.__context__ is not None else None
        if exc.code == 130 and isinstance(interrupt, KeyboardInterrupt):
            _say_interrupted(interrupt)
        raise
    except Exception as exc:
        code, command = exit_code(exc), _command()
        log = logfile.log_exception(exc, command)
        in_flow = any("prefect" in f.filename for f in traceback.extract_tb(exc.__traceback__))
        where = f"; full traceback in {log}" if log else ""
        if code == USAGE:
            line = escape(_one_line(exc)) + (escape(where) if in_flow else "")
        else:
            line = (
                f"{escape(command)} failed: {type(exc).__name__}: {escape(_one_line(exc))}"
                f"{escape(where)}; fix the cause and re-run the same command (it resumes)"
            )
        err.print(f"[red]error[/red]: {redact(line)}", soft_wrap=True)
        raise SystemExit(code) from None


def _say_interrupted(exc: BaseException) -> None:
    """One line for a Ctrl-C: a stage's own KeyboardInterrupt subclass says what it left
    behind (:class:`flows.collect.CollectInterrupted`), a plain one says "interrupted"."""
    err.print(escape(_one_line(exc)) if str(exc) else "interrupted", soft_wrap=True)


def _refuse_url_credentials(argv: list[str]) -> None:
    """Refuse a URL with a password in the command line (``--base-url
    http://user:key@host/v1``): it would be stored in the run's config and Prefect's flow-run
    parameters and show in ``ps``. Keys come from the environment (``WEBLOOP_API_KEY``)."""
    for arg in argv:
        if has_url_credentials(arg):
            raise ConfigError(
                f"refusing a URL with credentials in the command line ({redact(arg)}): it would "
                "be stored with the run; put the API key in WEBLOOP_API_KEY (or OPENAI_API_KEY) "
                "and pass the URL without user:password@"
            )


if __name__ == "__main__":
    main()
