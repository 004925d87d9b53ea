"""CLI commands for interventions (InT) and rationales (ERA): ``webloop intervene``,
``webloop rationales``."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from cli.common import existing_run
from cli.options import config_command
from stages.intervene import InterveneConfig


class TeacherName(StrEnum):
    expert = "expert"
    openai = "openai"


def _check_teacher(teacher: TeacherName, base_url: str | None, model: str | None) -> None:
    from cli.common import ConfigError

    if teacher is TeacherName.openai and not (base_url and model):
        raise ConfigError("--teacher openai needs --base-url and --model")


def intervene(cfg: InterveneConfig) -> None:
    """Find the first error of failed trajectories, propose one correction with a teacher and
    verify it by replay in Chromium (the `intervene` Prefect flow); resumable."""
    from cli.common import console
    from cli.progress import LiveProgress
    from flows.intervene import intervene as run_flow

    _check_teacher(TeacherName(cfg.teacher), cfg.base_url, cfg.model)
    with LiveProgress("intervene", console=console) as bar:
        out = run_flow(cfg, None, bar)
    console.print(
        f"intervene ({cfg.teacher_name}): {out.selected} failed trajectories selected; "
        f"{out.verified} corrections verified, {out.not_verified} not verified, "
        f"{out.no_error_found} without an error against the reference, "
        f"{out.errors} errors (re-run to retry); run {out.run_id}"
    )
    for line in out.skipped[:5]:
        console.print(f"  skipped {line}")
    for example in out.error_examples:
        console.print(f"  error: {example}")


def rationales(
    teacher: Annotated[
        TeacherName, typer.Option(help="expert (template) or openai (any compatible model).")
    ] = TeacherName.expert,
    run: Annotated[
        str | None, typer.Option(help="Only trajectories of this run.", callback=existing_run)
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="openai teacher: endpoint URL.")] = None,
    model: Annotated[str | None, typer.Option(help="openai teacher: model name.")] = None,
    max_steps: Annotated[
        int | None, typer.Option(help="At most this many steps now.", min=1)
    ] = None,
    k_images: Annotated[
        int, typer.Option(help="openai: screenshots of the last k steps.", min=0, max=32)
    ] = 3,
    concurrency: Annotated[int, typer.Option(help="Model requests at once.", min=1, max=256)] = 4,
) -> None:
    """Write a teacher's thought for each step of successful expert trajectories (stored apart
    from the trajectory; a recipe's include.rationales adds them); resumable."""
    from cli.common import ConfigError, console

    _check_teacher(teacher, base_url, model)
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    from curation.rationales import RationalesConfig
    from flows.intervene import rationales as run_flow

    cfg = RationalesConfig(
        teacher=teacher.value,
        run=run,
        base_url=base_url,
        model=model,
        max_steps=max_steps,
        k_images=k_images,
        concurrency=concurrency,
    )

    def progress(summary: Any) -> None:
        console.print(f"  … {summary.written} written, {summary.errors} errors")

    out = run_flow(cfg, None, progress)
    console.print(
        f"rationales ({out['teacher']}): {out['selected']} steps selected, {out['written']} "
        f"written, {out['errors']} per-step errors (re-run to retry); run {out['run_id']}"
    )
    for example in out["error_examples"]:
        console.print(f"  error: {example}")


def register(app: typer.Typer) -> None:
    """Add the intervention and rationale commands to the ``webloop`` app."""
    config_command(app, "intervene", InterveneConfig, intervene, callbacks={"run": existing_run})
    app.command("rationales")(rationales)
