"""``webloop deploy``: the scheduled deployments (judge backlog hourly, nightly evaluation of the
newest checkpoint on ``ood``, weekly warehouse maintenance) on a Prefect server."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import ConfigError, console

NO_SERVER = (
    "no Prefect server configured: start one (`prefect server start --host 127.0.0.1`) and "
    "point webloop at it (`export PREFECT_API_URL=http://127.0.0.1:4200/api`), or use --dry-run"
)


def register(app: typer.Typer) -> None:
    """Add ``webloop deploy`` to the ``webloop`` app."""

    @app.command()
    def deploy(
        dry_run: Annotated[
            bool, typer.Option(help="Print the deployments and schedules; contact no server.")
        ] = False,
        register_only: Annotated[
            bool, typer.Option(help="Create/update the deployments on the server, then exit.")
        ] = False,
        judge: Annotated[str, typer.Option(help="The judge of the hourly backlog run.")] = (
            "programmatic"
        ),
        judge_cron: Annotated[str, typer.Option(help="Cron of the judge backlog run.")] = (
            "0 * * * *"
        ),
        eval_cron: Annotated[str, typer.Option(help="Cron of the nightly evaluation.")] = (
            "0 2 * * *"
        ),
        eval_split: Annotated[str, typer.Option(help="Split the nightly evaluation runs on.")] = (
            "ood"
        ),
        eval_n: Annotated[
            int, typer.Option(help="Tasks of the nightly evaluation.", min=1, max=1_000_000)
        ] = 100,
        maintain_cron: Annotated[str, typer.Option(help="Cron of the warehouse maintenance.")] = (
            "0 4 * * 0"
        ),
        keep_recent_minutes: Annotated[
            float,
            typer.Option(
                help="Maintenance keeps snapshots younger than this.", min=0.0, max=525600.0
            ),
        ] = 60.0,
        limit: Annotated[
            int | None, typer.Option(help="Serve: at most this many flow runs at once.", min=1)
        ] = None,
    ) -> None:
        """Serve webloop's scheduled deployments on the Prefect server (PREFECT_API_URL)."""
        if dry_run and register_only:
            raise ConfigError("give --dry-run or --register-only, not both")
        from flows import deploy as dep
        from warehouse import WarehouseConfig

        home = str(WarehouseConfig.from_env().home.absolute())
        try:
            items = dep.schedules(
                home,
                judge=judge,
                judge_cron=judge_cron,
                eval_cron=eval_cron,
                eval_split=eval_split,
                eval_n=eval_n,
                maintain_cron=maintain_cron,
                keep_recent_minutes=keep_recent_minutes,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for s in items:
            console.print(
                f"{s.name}: flow {s.flow}, cron '{s.cron}', parameters {s.parameters}",
                soft_wrap=True,
                markup=False,
            )
        if dry_run:
            return
        url = dep.api_url()
        if url is None:
            raise ConfigError(NO_SERVER)
        if register_only:
            ids = dep.register(items)
            console.print(f"registered {len(ids)} deployments on {url}", soft_wrap=True)
            return
        console.print(f"serving {len(items)} deployments on {url} (Ctrl-C stops)", soft_wrap=True)
        dep.serve(items, limit=limit)
