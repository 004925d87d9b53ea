"""CLI commands for interventions (InT) and rationales (ERA): ``webloop intervene``,
``webloop rationales``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import typer

from cli.common import existing_run
from cli.options import config_command
from curation.rationales import RationalesConfig
from stages.intervene import InterveneConfig


class TeacherName(StrEnum):
    expert = "expert"
    openai = "openai"
    labels = "labels"


def _check_teacher(teacher: TeacherName, base_url: str | None, model: str | None) -> None:
    from cli.common import ConfigError

    if teacher is TeacherName.openai and not (base_url and model):
        raise ConfigError("--teacher openai needs --base-url and --model")


def intervene(cfg: InterveneConfig) -> None:
    """Find the first error of failed trajectories, propose one correction with a teacher and
    verify it by replay in Chromium (the `intervene` Prefect flow); resumable. ``--teacher
    labels`` takes both from the reference labels a ``label_reference`` rollout recorded."""
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


def rationales(cfg: RationalesConfig) -> None:
    """Write a teacher's thought for each step of successful expert trajectories (stored apart
    from the trajectory; a recipe's include.rationales adds them); resumable."""
    from cli.common import console
    from flows.intervene import rationales as run_flow

    _check_teacher(TeacherName(cfg.teacher), cfg.base_url, cfg.model)

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
    config_command(
        app,
        "intervene",
        InterveneConfig,
        intervene,
        callbacks={"run": existing_run},
        help="Corrective interventions for failed trajectories. A teacher finds the first error "
        "and proposes the correction; a replay in Chromium verifies it (the intervene flow).",
    )
    config_command(
        app,
        "rationales",
        RationalesConfig,
        rationales,
        callbacks={"run": existing_run},
        help="Teacher rationales (thoughts) for the expert's steps, stored with the run (ERA).",
    )
