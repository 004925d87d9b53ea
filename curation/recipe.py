"""Curation recipes: a YAML file → a typed, frozen :class:`Recipe`.

A recipe says which trajectories to take (``sources``), which filters to apply in order
(``filters``: one-key mappings ``{registered_name: {params}}``, see :mod:`curation.filters`),
how to balance and weight them (``balance``, ``curriculum``), what to add (``include``), what to
produce (``output``) and which quality gates to pass (``gates``). Every model is frozen and
forbids unknown keys.

Errors are one line naming the file, the YAML line and the field path, e.g.::

    recipe.yaml:7: filters[1].prm_threshold.min_score: Input should be a valid number

:func:`load_recipe` / :func:`parse_recipe` check structure and types; :func:`validate_against`
checks the names that need the warehouse (runs, splits, suites, judges, scorers, teachers)
before any work starts. :func:`recipe_hash` is the sha256 of the canonical JSON of the model
(same content → same hash, whatever the YAML layout or comments).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializeAsAny,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from curation.filters import FilterParams, params_model
from warehouse.connection import LAKE
from warehouse.store import Warehouse
from warehouse.yamlfile import YamlError, field_path, line_of, read_yaml

KNOWN_SPLITS = ("train", "valid", "test", "ood")
"""Splits every warehouse knows; other values are accepted if some task carries them."""

Loc = tuple[str | int, ...]


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is one line: ``file:line: field: problem``."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Cap = Annotated[StrictInt, Field(ge=1)] | None


class Sources(_Frozen):
    """Which trajectories a recipe starts from (empty list = no restriction)."""

    suites: tuple[str, ...] = Field((), description="Task suites; empty = all.")
    splits: tuple[str, ...] = Field(("train",), description="Task splits (train/valid/test/ood).")
    runs: tuple[str, ...] = Field((), description="Run ids or run names; empty = all.")
    policies: tuple[str, ...] = Field(
        (), description="trajectory.policy values; shell patterns allowed ('expert*')."
    )
    since: dt.datetime | None = Field(None, description="trajectory.created_at ≥ this.")
    until: dt.datetime | None = Field(None, description="trajectory.created_at < this.")

    @field_validator("since", "until", mode="before")
    @classmethod
    def _utc(cls, v: Any) -> Any:
        """A date is midnight UTC; a timestamp without a zone is UTC."""
        if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
            return dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC)
        if isinstance(v, dt.datetime) and v.tzinfo is None:
            return v.replace(tzinfo=dt.UTC)
        return v

    def policy_matches(self, policy: str) -> bool:
        return not self.policies or any(fnmatch.fnmatchcase(policy, p) for p in self.policies)


class FilterSpec(_Frozen):
    """One filter of a recipe: its registered name and validated params.

    Written (and serialised) as the one-key mapping ``{name: {params}}``.
    """

    name: str
    params: SerializeAsAny[FilterParams]

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: Any) -> Any:
        if isinstance(data, FilterSpec):
            return data
        if isinstance(data, dict) and isinstance(data.get("params"), FilterParams):
            return data
        name, raw = _filter_item(data)
        try:
            model = params_model(name)
            return {"name": name, "params": model.model_validate(raw)}
        except ValidationError as exc:  # parse_recipe reports these with their exact field
            first = exc.errors()[0]
            raise ValueError(f"{name}.{field_path(first['loc'])}: {first['msg']}") from None

    @model_serializer
    def _as_mapping(self) -> dict[str, Any]:
        return {self.name: self.params.model_dump(mode="json")}


class Balance(_Frozen):
    """At most N trajectories per group (null: no cap), chosen deterministically."""

    per_site: Cap = None
    per_difficulty: Cap = None
    per_task: Cap = None


class Curriculum(_Frozen):
    """Task weights from success history (DigiRL) and a horizon schedule (TTI)."""

    weights: Literal["none", "intermediate"] = Field(
        "none", description="none: 1.0 each; intermediate: tasks near 50% success weigh most."
    )
    horizon: tuple[Annotated[StrictInt, Field(ge=1)], ...] = Field(
        (), description="Max steps per RL round, e.g. [5, 10, 20]."
    )


class Include(_Frozen):
    interventions: StrictBool = Field(False, description="Verified interventions → SFT examples.")
    rationales: str | None = Field(None, description="Teacher whose rationales to include.")


class Output(_Frozen):
    sft: StrictBool = True
    rl_groups: StrictBool = False
    preferences: StrictBool = False
    k_images: StrictInt = Field(
        3, ge=0, description="The prompt builder's last-k images (0: text-only prompts)."
    )


class Gates(_Frozen):
    success_rate: tuple[float, float] = Field(
        (0.0, 1.0), description="Bounds on the selected trajectories' success rate."
    )

    @field_validator("success_rate")
    @classmethod
    def _bounds(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] <= v[1] <= 1.0:
            raise ValueError("bounds must satisfy 0 <= low <= high <= 1")
        return v


class Recipe(_Frozen):
    """A curation recipe (see the module docstring and curation/recipes/*.yaml)."""

    name: str = Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Dataset name: letters, digits, '.', '_' and '-' (it names the export folder).",
    )
    description: str = ""
    sources: Sources = Sources()
    filters: tuple[FilterSpec, ...] = ()
    balance: Balance = Balance()
    curriculum: Curriculum = Curriculum()
    include: Include = Include()
    output: Output = Output()
    gates: Gates = Gates()

    _source: str = PrivateAttr("<recipe>")
    _lines: dict[Loc, int] = PrivateAttr(default_factory=dict)

    def where(self, loc: Loc) -> str:
        """``source:line`` of a field path (the nearest enclosing node that has a line)."""
        return f"{self._source}:{line_of(self._lines, loc)}"

    def error(self, loc: Loc, problem: str) -> RecipeError:
        return RecipeError(f"{self.where(loc)}: {field_path(loc)}: {problem}")


# -- loading -----------------------------------------------------------------------------------


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe file (RecipeError on any problem)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read the recipe: {exc.strerror or exc}") from None
    return parse_recipe(text, str(path))


def parse_recipe(text: str, source: str) -> Recipe:
    """Validate recipe YAML ``text``; ``source`` names it in errors (usually the file path)."""
    try:
        data, lines = read_yaml(text, source)  # anchors and aliases refused before building
    except YamlError as exc:
        raise RecipeError(str(exc)) from None
    if not isinstance(data, dict):
        raise RecipeError(f"{source}:1: the recipe must be a mapping of fields (name, filters, …)")

    def fail(loc: Loc, msg: str) -> RecipeError:
        return RecipeError(
            f"{source}:{line_of(lines, loc)}: {field_path(loc) or '<recipe>'}: {msg}"
        )

    _check_filters(data.get("filters"), fail)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise fail(tuple(first["loc"]), first["msg"]) from None
    recipe._source = source
    recipe._lines = lines
    return recipe


def _check_filters(items: Any, fail) -> None:
    """Each filter item with exact field paths (the model's own check is less precise)."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        try:
            name, raw = _filter_item(item)
            model = params_model(name)
        except ValueError as exc:
            raise fail(("filters", i), str(exc)) from None
        try:
            model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise fail(("filters", i, name, *first["loc"]), first["msg"]) from None


def _filter_item(data: Any) -> tuple[str, Any]:
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError("a filter is a one-key mapping {name: {params}}")
    ((name, raw),) = data.items()
    if raw is None:
        raw = {}
    if not isinstance(name, str):
        raise ValueError("a filter name must be a string")
    return name, raw


def recipe_hash(recipe: Recipe) -> str:
    """sha256 of the canonical JSON of the recipe (sorted keys, no whitespace)."""
    blob = json.dumps(recipe.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# -- names that need the warehouse --------------------------------------------------------------


def _distinct(wh: Warehouse, table: str, column: str) -> set[str]:
    df = wh.sql(f"SELECT DISTINCT {column} AS v FROM {LAKE}.{table} WHERE {column} IS NOT NULL")
    return {str(v) for v in df.get_column("v").to_list()}


def _known(names: set[str]) -> str:
    shown = sorted(names)
    more = f", … ({len(shown)} in all)" if len(shown) > 10 else ""
    return ", ".join(shown[:10]) + more if shown else "none"


def validate_against(recipe: Recipe, wh: Warehouse) -> dict[str, set[str]]:
    """Check the recipe's warehouse names (current snapshot) before any work starts.

    Runs (run id or name, or a run id some trajectory carries), splits (the usual four or one
    a task carries), suites, judges (``judgments.judge``), PRM scorers (``step_scores.scorer``)
    and the rationale teacher (``rationales.teacher``). RecipeError on the first unknown one;
    otherwise the names checked, by kind (``{"run": {...}, "judge": {...}, …}``).
    """
    src = recipe.sources
    checks: list[tuple[Loc, str, Any]] = []
    checks += [(("sources", "runs", i), "run", r) for i, r in enumerate(src.runs)]
    checks += [(("sources", "splits", i), "split", s) for i, s in enumerate(src.splits)]
    checks += [(("sources", "suites", i), "suite", s) for i, s in enumerate(src.suites)]
    for i, f in enumerate(recipe.filters):
        for kind, sub, value in f.params.warehouse_names():
            checks.append((("filters", i, f.name, *sub), kind, value))
    if recipe.include.rationales is not None:
        checks.append((("include", "rationales"), "teacher", recipe.include.rationales))
    cache: dict[str, set[str]] = {}
    for loc, kind, value in checks:
        if kind not in cache:
            cache[kind] = _names(wh, kind)
        if value not in cache[kind]:
            raise recipe.error(loc, f"unknown {kind} {value!r} (known: {_known(cache[kind])})")
    checked: dict[str, set[str]] = {}
    for _, kind, value in checks:
        checked.setdefault(kind, set()).add(value)
    return checked


def _names(wh: Warehouse, kind: str) -> set[str]:
    if kind == "run":
        return (
            _distinct(wh, "runs", "run_id")
            | _distinct(wh, "runs", "name")
            | _distinct(wh, "trajectories", "run_id")
        )
    if kind == "split":
        return set(KNOWN_SPLITS) | _distinct(wh, "tasks", "split")
    table, column = {
        "suite": ("tasks", "suite"),
        "judge": ("judgments", "judge"),
        "scorer": ("step_scores", "scorer"),
        "teacher": ("rationales", "teacher"),
    }[kind]
    return _distinct(wh, table, column)
