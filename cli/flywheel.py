"""CLI commands of the main job: ``webloop flywheel`` (N rounds of the whole loop, resumable)
and ``webloop demo`` (the flywheel at CPU scale on the bundled sites; ``make demo`` runs it).

``python -m cli.flywheel flywheel …`` runs the same commands without the rest of the CLI.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from cli.common import ConfigError, console
from cli.options import config_command
from stages.flywheel import FlywheelConfig, FlywheelResult


def flywheel(cfg: FlywheelConfig) -> None:
    """The main job: N rounds of collect → judge → score → intervene → curate → train →
    evaluate with the ranker on the bundled sites; killed and re-run, it continues."""
    from curation.recipe import RecipeError
    from flows.demo import lend
    from flows.flywheel import flywheel_flow
    from stages.flywheel import eval_line

    try:
        cfg.check()
    except RecipeError as exc:
        raise ConfigError(str(exc)) from None
    console.print(f"[bold]webloop flywheel[/bold] {cfg.flywheel_id}: {cfg.rounds} round(s) …")
    with lend() as lent:  # one sites server and one Chromium for every stage
        out = flywheel_flow(cfg, None, lent)
    _print_rounds(out)
    u, f, d = out.untrained, out.final, out.overall
    console.print(f"untrained {eval_line(u)} → final {eval_line(f)} ({100 * d['diff']:+.1f})")


def _print_rounds(out: FlywheelResult) -> None:
    for r in out.rounds:
        console.print(r.markdown, soft_wrap=True)
        console.print()


def register(app: typer.Typer) -> None:
    """Add ``flywheel`` and ``demo`` to the ``webloop`` app."""

    config_command(app, "flywheel", FlywheelConfig, flywheel, help=flywheel.__doc__)

    @app.command("demo")
    def demo(
        seed: Annotated[
            int, typer.Option(help="Seed of tasks, rollouts and training.", min=0, max=2**32 - 1)
        ] = 0,
        rounds: Annotated[int, typer.Option(min=1, help="Rounds of the flywheel.")] = 2,
    ) -> None:
        """The main job at CPU scale: the bundled sites, expert and policy rollouts in Chromium,
        judge, PRM, interventions, curate, train the ranker, evaluate — then a summary. Run it
        again: it continues, or finds everything done."""
        from flows.demo import demo_config, demo_state, run_demo, summary_lines

        cfg = demo_config(seed=seed, rounds=rounds)
        state = demo_state(cfg)
        console.print(
            f"[bold]webloop demo[/bold]: the Prefect flow 'flywheel' ({cfg.flywheel_id}, "
            f"{rounds} round(s)) — "
            + {
                "new": "starting the sites and Chromium …",
                "interrupted": "an earlier demo stopped part-way: continuing it …",
                "done": "an earlier demo finished: checking that every stage is stored …",
            }[state]
        )
        t0 = time.perf_counter()
        out = run_demo(cfg)
        for line in summary_lines(out):
            console.print(line, soft_wrap=True)
        console.print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False)
    register(_app)
    _app()
