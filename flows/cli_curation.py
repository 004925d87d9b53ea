"""CLI commands of the curation stage: ``webloop curate``, ``webloop datasets list|show|diff``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the curation commands to the ``webloop`` app."""
