"""What every ``webloop`` command module shares: consoles, output formats, the input-error type,
registry-name validation and opening the warehouse. (Command modules import this, never
``cli.app``, which imports them.)"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from cli.terminal import SafeConsole, cell
from warehouse import Warehouse, WarehouseConfig
from warehouse.config import ConfigError

# Lines are never wrapped at the console width: a message that names a file stays one line
# (grep-able, and the same whatever the terminal or the COLUMNS it started with); tables still
# fit the width.
console = SafeConsole(soft_wrap=True)
err = SafeConsole(stderr=True, soft_wrap=True)


def fit_consoles() -> None:
    """Size the consoles from the environment as it is now (``COLUMNS``, else the terminal):
    rich fixes a console's width from ``COLUMNS`` when it is made, which for a process that runs
    the CLI more than once (tests, a notebook) is whatever the first import saw."""
    columns = os.environ.get("COLUMNS", "")
    for c in (console, err):
        c.width = int(columns) if columns.isdigit() else None  # type: ignore[assignment]


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


#: The ``--format`` option of every listing command (declared once).
FormatOption = Annotated[
    Format, typer.Option("--format", help="Output format: table, csv or json.")
]


def _policies() -> list[str]:
    import rollouts.hf  # (registers 'hf'; transformers loads only when used)
    import rollouts.ranker  # noqa: F401  (registers 'ranker')
    from rollouts.policies import POLICIES

    return POLICIES.names()


def _judges() -> list[str]:
    from judging.base import JUDGES  # importing the package registers every judge

    return JUDGES.names()


def _scorers() -> list[str]:
    from judging.prm import SCORERS

    return SCORERS.names()


def _registered(kind: str, names: Any, *, many: bool = False) -> Any:
    """An option callback: the value must be a registered name (``many``: a comma-separated
    list of them). Runs while the command line is parsed, before any flow starts; an unknown
    name is a usage error (exit 2) that lists the known ones."""

    def check(value: str | None) -> str | None:
        if value is None:
            return value
        known = names()
        given = [v.strip() for v in value.split(",")] if many else [value]
        unknown = [v for v in given if v not in known]
        if unknown:
            raise typer.BadParameter(
                f"unknown {kind} {', '.join(map(repr, unknown))}; choose from {', '.join(known)}"
            )
        return value

    return check


def _open(*, read_only: bool = False) -> Warehouse:
    return Warehouse.open(WarehouseConfig.from_env(), read_only=read_only)


def existing_run(value: str | None) -> str | None:
    """Option callback of ``--run`` options that select stored work: the run must exist (a
    misspelt run id otherwise selected nothing and the command said "judged 0", exit 0)."""
    if value is None:
        return None
    from warehouse.listings import run_exists

    with _open(read_only=True) as wh:
        found = run_exists(wh, value)
    if not found:
        raise ConfigError(f"--run: no run {value!r} in the warehouse (`webloop runs` lists them)")
    return value


def print_frame(df: Any, fmt: Format = Format.table, title: str | None = None) -> None:
    """Print a frame as a rich table, CSV or JSON rows.

    ``df``: any frame with ``columns`` (names), ``iter_rows()`` (value tuples), ``write_csv()``
    and ``write_json()`` (text): the polars frames the warehouse's queries return
    (:mod:`warehouse.listings`, ``Warehouse.sql``) and :func:`warehouse.frames.rows_frame`
    builds. The CLI imports no polars (an import-linter contract)."""
    if fmt is Format.csv:
        sys.stdout.write(df.write_csv())
    elif fmt is Format.json:
        sys.stdout.write(df.write_json() + "\n")
    else:
        table = Table(title=title, show_lines=False)
        for name in df.columns:
            table.add_column(name, overflow="fold")
        for row in df.iter_rows():
            table.add_row(*(cell(v) for v in row))
        console.print(table)
