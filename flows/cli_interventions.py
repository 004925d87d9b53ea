"""CLI commands for interventions (InT) and rationales (ERA): ``webloop intervene``,
``webloop rationales``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the intervention and rationale commands to the ``webloop`` app."""
