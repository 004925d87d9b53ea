"""CLI commands of the main job: ``webloop flywheel`` (N rounds of the whole loop, resumable)
and ``webloop demo`` (the flywheel at CPU scale on the bundled sites; ``make demo`` runs it).

``python -m cli.flywheel flywheel …`` runs the same commands without the rest of the CLI.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import UserError, console


def _config(**kw: Any) -> Any:
    from curation.recipe import RecipeError
    from flows.flywheel import FlywheelConfig, FlywheelError

    cfg = FlywheelConfig(**kw)
    try:
        cfg.check()
    except (FlywheelError, RecipeError) as exc:
        raise UserError(str(exc)) from None
    return cfg


def _print_rounds(out: dict[str, Any]) -> None:
    for r in out["rounds"]:
        console.print(r["markdown"], soft_wrap=True)
        console.print()


def register(app: typer.Typer) -> None:
    """Add ``flywheel`` and ``demo`` to the ``webloop`` app."""

    @app.command("flywheel")
    def flywheel(
        rounds: Annotated[int, typer.Option(min=1, help="Rounds of the loop.")] = 2,
        seed: Annotated[
            int, typer.Option(help="Seed of tasks, rollouts and training.", min=0, max=2**32 - 1)
        ] = 0,
        bundled_tasks: Annotated[int, typer.Option(min=1, help="Bundled tasks to generate.")] = 200,
        expert_tasks: Annotated[int, typer.Option(min=1, help="Round 1: expert tasks.")] = 24,
        noise: Annotated[
            float, typer.Option(help="The expert's mistake rate per step.", min=0.0, max=1.0)
        ] = 0.12,
        policy_tasks: Annotated[int, typer.Option(min=1, help="Policy tasks per round.")] = 8,
        group_size: Annotated[int, typer.Option(min=1, help="Samples per task (G).")] = 2,
        temperature: Annotated[
            float, typer.Option(help="Policy sampling temperature.", min=0.0, max=5.0)
        ] = 1.0,
        prm_states: Annotated[int, typer.Option(min=0, help="PRM-scored states per round.")] = 4,
        prm_k: Annotated[int, typer.Option(min=2, help="PRM candidates per state.")] = 3,
        interventions: Annotated[
            int, typer.Option(min=0, help="Failures the expert teacher corrects per round.")
        ] = 2,
        recipe: Annotated[
            Path | None, typer.Option(help="Curation recipe (default: the flywheel's own).")
        ] = None,
        epochs: Annotated[int, typer.Option(min=1, help="Round 1's SFT epochs.")] = 6,
        later_epochs: Annotated[int, typer.Option(min=1, help="Later rounds' SFT epochs.")] = 3,
        eval_n: Annotated[int, typer.Option(min=1, help="Held-out tasks evaluated.")] = 24,
        eval_max_steps: Annotated[int, typer.Option(min=1)] = 24,
        concurrency: Annotated[int, typer.Option(min=1)] = 4,
    ) -> None:
        """The main job: N rounds of collect → judge → score → intervene → curate → train →
        evaluate with the ranker on the bundled sites; killed and re-run, it continues."""
        from flows.demo import lend
        from flows.flywheel import flywheel_flow

        cfg = _config(
            rounds=rounds,
            seed=seed,
            bundled_tasks=bundled_tasks,
            expert_tasks=expert_tasks,
            noise=noise,
            policy_tasks=policy_tasks,
            group_size=group_size,
            temperature=temperature,
            prm_states=prm_states,
            prm_k=prm_k,
            interventions=interventions,
            recipe=str(recipe) if recipe else None,
            epochs=epochs,
            later_epochs=later_epochs,
            eval_n=eval_n,
            eval_max_steps=eval_max_steps,
            concurrency=concurrency,
        )
        console.print(f"[bold]webloop flywheel[/bold] {cfg.flywheel_id}: {rounds} round(s) …")
        with lend() as lent:  # one sites server and one Chromium for every stage
            out = flywheel_flow(cfg, None, lent)
        _print_rounds(out)
        u, f, d = out["untrained"], out["final"], out["overall"]
        from flows.flywheel import eval_line

        console.print(f"untrained {eval_line(u)} → final {eval_line(f)} ({100 * d['diff']:+.1f})")

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
