"""The ``curate`` stage: build a versioned dataset from a recipe (the work is in
``curation.build.build_dataset``; ``flows.curate`` runs it as a Prefect flow).

Re-running the same recipe over the same snapshot rebuilds the same dataset (same id, the same
bytes) in place; a failing quality gate registers nothing and leaves no export folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curation.build import CurationError, build_dataset
from curation.gates import GateError
from curation.recipe import RecipeError, load_recipe
from stages.config import ConfigError, setting
from stages.report import markdown_table
from stages.runs import code_version
from warehouse import Warehouse
from warehouse.datasets import COMPOSITION_COLUMNS, dataset_composition


@dataclass(frozen=True)
class CurateConfig:
    """Which recipe, over which snapshot, exported where."""

    recipe: str = setting("", help="Recipe YAML file.")
    out: str | None = setting(None, help="Export folder (default $WEBLOOP_HOME/datasets).")
    snapshot: int | None = setting(
        None, help="Warehouse snapshot to build from (default: the current one).", min=0
    )


@dataclass(frozen=True)
class CurateResult:
    """The dataset built: its id, name, pinned snapshot, counts per part, export folder and
    recipe hash."""

    dataset_id: str
    name: str
    snapshot_id: int
    counts: dict[str, int]
    export_path: str
    recipe_hash: str
    composition: list[dict[str, Any]]


def check_recipe(cfg: CurateConfig) -> None:
    """A missing or malformed recipe, before any work starts."""
    if not cfg.recipe:
        raise ConfigError("--recipe: give the recipe YAML file")
    try:
        load_recipe(Path(cfg.recipe))
    except RecipeError as exc:
        raise ConfigError(str(exc)) from None


def run_curate(
    wh: Warehouse, cfg: CurateConfig, progress: Callable[[str], None] | None = None
) -> CurateResult:
    """Build, gate, export and register the dataset (a bad recipe or a failing gate is a
    :class:`ConfigError` naming it)."""
    check_recipe(cfg)
    out = Path(cfg.out) if cfg.out else wh.cfg.home / "datasets"
    try:
        record = build_dataset(
            wh,
            load_recipe(Path(cfg.recipe)),
            out_dir=out,
            snapshot_id=cfg.snapshot,
            blobs=wh.blobs,
            progress=progress,
            code_version=code_version(),
        )
    except (RecipeError, CurationError, GateError) as exc:
        raise ConfigError(str(exc)) from None
    return CurateResult(
        dataset_id=record.dataset_id,
        name=record.name,
        snapshot_id=record.snapshot_id,
        counts=record.counts or {},
        export_path=record.export_path,
        recipe_hash=record.recipe_hash,
        composition=dataset_composition(wh, record.dataset_id),
    )


def composition_markdown(res: CurateResult) -> str:
    """The dataset's counts and its composition table as markdown."""
    counts = markdown_table([{"part": k, "rows": v} for k, v in res.counts.items()])
    return (
        f"# Dataset {res.name}\n\n`{res.dataset_id}` at warehouse snapshot "
        f"{res.snapshot_id}; export `{res.export_path}`\n\n## Counts\n\n{counts}\n\n"
        "## Composition (members by site, split, policy)\n\n"
        + markdown_table(res.composition, COMPOSITION_COLUMNS)
    )
