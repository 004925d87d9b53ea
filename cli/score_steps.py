"""``webloop score-steps``: its options are :class:`stages.score_steps.ScoreStepsConfig`'s
fields (the subcommand ``score-steps agreement`` stays in :mod:`cli.app`)."""

from __future__ import annotations

import typer

from cli.common import _policies, _registered, _scorers, console, existing_run
from cli.options import config_command
from stages.score_steps import ScoreStepsConfig


def score_steps(cfg: ScoreStepsConfig) -> None:
    """Sample K candidates per visited state, score them, store scores and advantages."""
    from cli.progress import LiveProgress
    from flows.score_steps import score_steps as run_flow
    from stages.score_steps import check_config

    check_config(cfg)  # before the flow starts
    with LiveProgress("score-steps", console=console) as bar:
        out = run_flow(cfg, None, bar)
    console.print(
        f"score-steps {cfg.scorer}: {out.selected} states selected, {out.states} scored now "
        f"({out.candidates} candidates: {out.scored} ok, {out.errors} scorer errors); "
        f"run {out.run_id}"
    )
    for example in out.error_examples:
        console.print(f"  scorer error: {example}")


def register(group: typer.Typer) -> None:
    config_command(
        group,
        "score-steps",
        ScoreStepsConfig,
        score_steps,
        help=score_steps.__doc__,
        group=True,
        callbacks={
            "scorer": _registered("PRM scorer", _scorers),
            "policy": _registered("policy", _policies),
            "run": existing_run,
        },
    )
