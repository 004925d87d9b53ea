"""``webloop judge``: its options are :class:`stages.judge.JudgeConfig`'s fields (the group's
subcommands, ``judge agreement`` and ``judge flips``, stay in :mod:`cli.app`)."""

from __future__ import annotations

import typer

from cli.common import _judges, _registered, console, existing_run
from cli.options import config_command
from stages.judge import JudgeConfig


def judge(cfg: JudgeConfig) -> None:
    """Judge trajectories that have no verdict from this judge version yet (the judge flow)."""
    from cli.progress import LiveProgress
    from flows.judge import judge as run_flow
    from stages.judge import check_judge

    check_judge(cfg)  # bad options fail here, before the flow starts
    with LiveProgress("judge", console=console) as bar:
        out = run_flow(cfg, None, bar)
    console.print(f"{out.judge} {out.version}: {out.line}")
    for example in out.error_examples:
        console.print(f"  judge error: {example}")


def register(group: typer.Typer) -> None:
    config_command(
        group,
        "judge",
        JudgeConfig,
        judge,
        help=judge.__doc__,
        group=True,
        callbacks={
            "judge": _registered("judge", _judges),
            "members": _registered("judge", _judges, many=True),
            "run": existing_run,
        },
    )
