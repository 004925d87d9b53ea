"""``webloop collect``: its options are :class:`stages.collect.CollectConfig`'s fields."""

from __future__ import annotations

import typer

from cli.common import _open, _policies, _registered, console
from cli.options import config_command
from stages.collect import CollectConfig


def collect(cfg: CollectConfig) -> None:
    """Collect rollouts with a policy in real Chromium (the `collect` Prefect flow); resumable."""
    from cli.progress import LiveProgress
    from flows.collect import collect as run_flow
    from stages.collect import refuse_nothing_collected

    console.print(
        f"[bold]collect[/bold]: {cfg.n_tasks} {cfg.suite}/{cfg.split or 'all'} tasks × "
        f"{cfg.samples}, policy {cfg.policy}, concurrency {cfg.concurrency}"
    )
    with LiveProgress("collect", console=console) as bar:
        out = run_flow(cfg, on_progress=bar)
    console.print(
        f"run {out.run_id}: ran {out.ran} trajectories "
        f"(skipped {out.skipped} already stored), {out.steps} steps, "
        f"{out.steps_per_s} steps/s; outcomes {out.by_status}; "
        f"written in {out.transactions} transaction(s)"
    )
    with _open(read_only=True) as wh:
        refuse_nothing_collected(wh, out)


def register(app: typer.Typer) -> None:
    config_command(
        app,
        "collect",
        CollectConfig,
        collect,
        help=collect.__doc__,
        callbacks={"policy": _registered("policy", _policies)},
    )
