"""Curation filters: pure functions over warehouse rows, registered by name with a params model.

A recipe lists filters as one-key mappings ``{name: {params}}``; :data:`FILTERS` maps each name
to its params model (``FILTERS.make(name, **params)`` validates them), and :func:`apply_filter`
runs the registered function. Every function has the shape::

    fn(frames: Frames, params: P) -> Frames

and returns a :class:`Frames` with fewer trajectories and/or fewer kept steps. Functions never
build one Python object per step: they compute boolean masks and semi-joins with polars (and
DuckDB SQL for auxiliary tables, read at the pinned snapshot through :class:`Lake`). The
selection runner (:mod:`curation.select`) counts what each one removed.

Trajectory-level filters: ``verdict``, ``length``, ``dedup_trajectories``, ``dedup_tasks``.
Step-level filters: ``prm_threshold``, ``before_first_error``, ``drop_invalid_steps``,
``drop_loops``. Infra errors,
timeouts and running trajectories are removed by :func:`exclude_infra` before any of them,
always (it is not registered: a recipe cannot leave it out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from curation.embed import DEFAULT_THRESHOLD, distinct_instances, near_duplicates, template_key
from warehouse.connection import LAKE
from warehouse.records import INFRA_ERROR, RUNNING, TIMEOUT, VERDICTS
from warehouse.registry import Registry
from warehouse.relations import with_relations
from warehouse.store import Warehouse

EXCLUDED_STATUSES = (INFRA_ERROR, TIMEOUT, RUNNING)
"""Statuses never selected: an infrastructure failure is never a reward nor SFT data."""


# -- reading the lake at a pinned snapshot -------------------------------------------------------


class Lake:
    """Reads of one warehouse at one pinned snapshot (``AT (VERSION => n)`` on every table).

    A query may name the shared relations of :mod:`warehouse.relations` (``trajectory_tasks``,
    ``latest_judgments``, …): they are read at the snapshot too."""

    def __init__(self, wh: Warehouse, snapshot_id: int) -> None:
        self.wh = wh
        self.snapshot_id = int(snapshot_id)

    @staticmethod
    def table(name: str, alias: str | None = None) -> str:
        """``lake.<name> [AS alias] AT (VERSION => $snap)`` for a FROM clause (name and alias
        are constants of the code, never user values; DuckDB wants the alias before AT)."""
        named = f" AS {alias}" if alias else ""
        return f"{LAKE}.{name}{named} AT (VERSION => $snap)"

    def sql(self, query: str, params: dict[str, Any] | None = None) -> pl.DataFrame:
        """Run ``query`` (tables via :meth:`table`, values as ``$name`` parameters)."""
        query = with_relations(query, at="$snap")
        values = {**(params or {}), "snap": self.snapshot_id}
        used = {k: v for k, v in values.items() if f"${k}" in query}
        return self.wh.sql(query, used or None)

    def with_ids(self, name: str, ids: pl.Series, query: str, params: dict | None = None):
        """Run ``query`` with the frame ``{traj_id: ids}`` registered as view ``name``."""
        self.wh.con.register(name, pl.DataFrame({"traj_id": ids}).to_arrow())
        try:
            return self.sql(query, params)
        finally:
            self.wh.con.unregister(name)


@dataclass(frozen=True)
class Frames:
    """What a filter sees and returns.

    ``trajectories``: the trajectories still selected (one row each; columns of
    :class:`curation.select.Selection` ``trajectories`` but ``weight``).
    ``steps``: EVERY stored step of the trajectories in the recipe's sources (not only the kept
    ones), sorted by (traj_id, step_idx): traj_id, step_idx, url, screenshot_hash, action_text,
    action_error, and ``obs_hash``: what the agent observed (the screenshot's hash; for a step
    without a screenshot, e.g. accessibility-tree observations, the tree's). It never changes,
    so filters that look at whole trajectories (dedup) see all of a trajectory's steps.
    ``kept``: boolean mask aligned with ``steps``: the steps still selected.
    ``lake``: reads at the pinned snapshot.
    """

    trajectories: pl.DataFrame
    steps: pl.DataFrame
    kept: pl.Series
    lake: Lake

    def keep_trajectories(self, mask: pl.Expr | pl.Series) -> Frames:
        """Frames with only the trajectories where ``mask`` holds (steps follow)."""
        trajs = self.trajectories.filter(mask)
        kept = self.kept & self.steps.get_column("traj_id").is_in(
            trajs.get_column("traj_id").implode()
        )
        return dataclasses.replace(self, trajectories=trajs, kept=kept)

    def drop_steps(self, drop: pl.Series) -> Frames:
        """Frames without the steps where ``drop`` (aligned with ``steps``) is true."""
        return dataclasses.replace(self, kept=self.kept & ~drop.fill_null(False))


# -- the registry ------------------------------------------------------------------------------


class FilterParams(BaseModel):
    """Base of every filter's params: frozen, unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def warehouse_names(self) -> list[tuple[str, tuple[str | int, ...], Any]]:
        """Names this filter needs in the warehouse: ``(kind, field path, value)``, kind one of
        ``judge`` / ``scorer`` (checked by :func:`curation.recipe.validate_against`)."""
        return []


P = TypeVar("P", bound=FilterParams)
FilterFn = Callable[[Frames, Any], Frames]

FILTERS: Registry[FilterParams] = Registry("filter")
"""Filter name → its params model (``FILTERS.make(name, **params)`` validates the params)."""
_FUNCTIONS: dict[str, FilterFn] = {}


def register(name: str, params: type[P]) -> Callable[[FilterFn], FilterFn]:
    """``@register("length", LengthParams)`` on ``fn(frames, params) -> frames``."""

    def deco(fn: FilterFn) -> FilterFn:
        FILTERS.register(name)(params)
        _FUNCTIONS[name] = fn
        return fn

    return deco


def params_model(name: str) -> type[FilterParams]:
    """The params model of a registered filter (ValueError naming the known ones if unknown)."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; known: {', '.join(FILTERS.names())}")
    return FILTERS.factories[name]  # type: ignore[return-value]


def apply_filter(name: str, frames: Frames, params: FilterParams) -> Frames:
    """Run the registered filter ``name``."""
    return _FUNCTIONS[name](frames, params)


# -- always on -------------------------------------------------------------------------------


def exclude_infra(frames: Frames) -> Frames:
    """Drop trajectories whose status is infra_error, timeout or running (always applied)."""
    return frames.keep_trajectories(~pl.col("status").is_in(list(EXCLUDED_STATUSES)))


# -- trajectory-level --------------------------------------------------------------------------


class VerdictParams(FilterParams):
    judges: tuple[str, ...] = Field(min_length=1, description="Judge names (judgments.judge).")
    verdict: Literal["success", "failure", "abstain"] = Field(
        "success", description=f"The verdict to require, one of {VERDICTS}."
    )
    min_agreement: float = Field(
        1.0, gt=0.0, le=1.0, description="Fraction of the named judges that must say it."
    )

    def warehouse_names(self):
        return [("judge", ("judges", i), j) for i, j in enumerate(self.judges)]


@register("verdict", VerdictParams)
def verdict(frames: Frames, p: VerdictParams) -> Frames:
    """Keep trajectories on which enough of the named judges give ``verdict``.

    Per (trajectory, judge) the latest judgment counts (``latest_judgments`` of
    :mod:`warehouse.relations`: by created_at, then judge_version, then judgment_id; the same
    judgment judge calibration and the dashboard read). A trajectory passes when (number of
    named judges whose latest judgment has ``verdict`` and no error) / (number of named judges)
    ≥ ``min_agreement``. A judge whose latest judgment on the trajectory is an error, or that
    never judged it, counts as NOT agreeing (it is in the denominator).
    """
    passing = judged(frames.lake, frames.trajectories.get_column("traj_id"), p)
    return frames.keep_trajectories(pl.col("traj_id").is_in(passing.implode()))


def judged(lake: Lake, traj_ids: pl.Series, p: VerdictParams) -> pl.Series:
    """The ids among ``traj_ids`` on which enough of ``p.judges`` give ``p.verdict`` (the rule
    of :func:`verdict`; the success-rate gate counts the recipe's judges by it too)."""
    judges = sorted(set(p.judges))
    agree = lake.with_ids(
        "__cur_trajs",
        traj_ids,
        """
        SELECT traj_id, count(*) AS n_agree FROM latest_judgments
        WHERE traj_id IN (SELECT traj_id FROM __cur_trajs) AND list_contains($judges, judge)
          AND error IS NULL AND verdict = $verdict
        GROUP BY traj_id
        """,
        {"judges": judges, "verdict": p.verdict},
    )
    need = p.min_agreement * len(judges) - 1e-9
    return agree.filter(pl.col("n_agree") >= need).get_column("traj_id")


class LengthParams(FilterParams):
    min_steps: StrictInt = Field(1, ge=0, description="Fewest steps a trajectory may have.")
    max_steps: StrictInt | None = Field(None, ge=0, description="Most steps (null: no limit).")

    @model_validator(mode="after")
    def _ordered(self) -> LengthParams:
        if self.max_steps is not None and self.max_steps < self.min_steps:
            raise ValueError(f"max_steps ({self.max_steps}) < min_steps ({self.min_steps})")
        return self


@register("length", LengthParams)
def length(frames: Frames, p: LengthParams) -> Frames:
    """Keep trajectories with ``min_steps ≤ n_steps ≤ max_steps``. The length is the
    trajectory's recorded step count (``trajectories.n_steps``), not what step filters kept."""
    cond = pl.col("n_steps").fill_null(0) >= p.min_steps
    if p.max_steps is not None:
        cond = cond & (pl.col("n_steps").fill_null(0) <= p.max_steps)
    return frames.keep_trajectories(cond)


class DedupTrajectoriesParams(FilterParams):
    pass


@register("dedup_trajectories", DedupTrajectoriesParams)
def dedup_trajectories(frames: Frames, p: DedupTrajectoriesParams) -> Frames:
    """Keep one trajectory (the first traj_id in sorted order) of each set with the same task
    and the same sequence of (observation, action_text) over ALL its stored steps (``obs_hash``:
    the screenshot, or the accessibility tree of a step without one)."""
    live = frames.trajectories.select("traj_id", "task_id")
    seq = (
        frames.steps.filter(pl.col("traj_id").is_in(live.get_column("traj_id").implode()))
        .group_by("traj_id", maintain_order=True)
        .agg(
            pl.concat_str(
                [
                    pl.col("obs_hash").fill_null("\x00"),
                    pl.col("action_text").fill_null("\x00"),
                ],
                separator="\x1e",
            )
            .str.join("\x1f")
            .alias("seq")
        )
    )
    keyed = live.join(seq, on="traj_id", how="left").with_columns(pl.col("seq").fill_null(""))
    firsts = (
        keyed.sort("traj_id").unique(subset=["task_id", "seq"], keep="first").get_column("traj_id")
    )
    return frames.keep_trajectories(pl.col("traj_id").is_in(firsts.implode()))


class DedupTasksParams(FilterParams):
    threshold: float = Field(
        DEFAULT_THRESHOLD, gt=0.0, le=1.0, description="MiniLM cosine similarity of instructions."
    )


@register("dedup_tasks", DedupTasksParams)
def dedup_tasks(frames: Frames, p: DedupTasksParams) -> Frames:
    """Drop the trajectories of near-duplicate tasks: instructions whose MiniLM cosine
    similarity is ≥ ``threshold`` (:func:`curation.embed.near_duplicates`), unless both are
    instances of one template with other parameters (:func:`curation.embed.distinct_instances`:
    "What is the brand of this product?" on two product pages). Tasks are taken in
    task_id order; a task is dropped when it is a near duplicate of an earlier task that was
    kept, so of each cluster the first task id stays."""
    tasks = (
        frames.trajectories.select("task_id", "instruction")
        .unique("task_id")
        .sort("task_id")
        .with_columns(pl.col("instruction").fill_null(""))
    )
    ids = tasks.get_column("task_id").to_list()
    keys = task_template_keys(frames.lake, ids)
    earlier: dict[int, list[int]] = {}
    for i, j, _ in near_duplicates(tasks.get_column("instruction").to_list(), None, p.threshold):
        if not distinct_instances(keys.get(ids[i]), keys.get(ids[j])):
            earlier.setdefault(j, []).append(i)
    dropped: set[int] = set()
    for j in range(len(ids)):
        if any(i not in dropped for i in earlier.get(j, [])):
            dropped.add(j)
    gone = [ids[j] for j in sorted(dropped)]
    return frames.keep_trajectories(~pl.col("task_id").is_in(gone))


def task_template_keys(lake: Lake, task_ids: list[str]) -> dict[str, tuple[str, str] | None]:
    """task_id → :func:`curation.embed.template_key` of its latest version at the snapshot."""
    df = lake.sql(
        "SELECT task_id, meta FROM latest_tasks WHERE task_id IN (SELECT unnest($ids))",
        {"ids": task_ids},
    )
    return {tid: template_key(meta) for tid, meta in df.iter_rows()}


# -- step-level --------------------------------------------------------------------------------


class PrmThresholdParams(FilterParams):
    scorer: str = Field(description="PRM scorer name (step_scores.scorer).")
    min_score: float = Field(description="Steps whose executed action scored below are dropped.")
    version: str | None = Field(None, description="Only this scorer_version (null: any).")
    unscored: Literal["drop", "keep"] = Field(
        "drop", description="Steps whose executed action has no score from the scorer."
    )

    def warehouse_names(self):
        return [("scorer", ("scorer",), self.scorer)]


@register("prm_threshold", PrmThresholdParams)
def prm_threshold(frames: Frames, p: PrmThresholdParams) -> Frames:
    """Drop steps whose EXECUTED action scored below ``min_score`` by the PRM ``scorer``.

    PRM scores belong to candidates (``step_scores`` keyed by cand_idx), and candidates are
    sampled at the state by a separate policy (judging/prm.py ``propose``): no cand_idx or flag
    marks the action the trajectory took. The executed action's score is therefore the score
    of a candidate at the same (traj_id, step_idx) whose ``action_text`` equals the step's
    ``action_text`` (canonical grammar text on both sides); with several such candidates, the
    highest score; per (candidate, scorer) the latest scored row (errors are not scores).
    A step with no such score is dropped (``unscored: drop``, the default) or kept.
    """
    cands = Lake.table("candidates", "c")
    scores = "latest_step_scores_per_version" if p.version else "latest_step_scores"
    scored = frames.lake.with_ids(
        "__cur_trajs",
        frames.trajectories.get_column("traj_id"),
        f"""
        WITH s AS (
            SELECT traj_id, step_idx, cand_idx, score FROM {scores}
            WHERE scorer = $scorer AND ($version IS NULL OR scorer_version = $version)
              AND error IS NULL AND score IS NOT NULL
              AND traj_id IN (SELECT traj_id FROM __cur_trajs)
        )
        SELECT c.traj_id, c.step_idx, c.action_text, max(s.score) AS taken_score
        FROM {cands} JOIN s USING (traj_id, step_idx, cand_idx)
        WHERE c.action_text IS NOT NULL
        GROUP BY c.traj_id, c.step_idx, c.action_text
        """,
        {"scorer": p.scorer, "version": p.version},
    )
    joined = frames.steps.select("traj_id", "step_idx", "action_text").join(
        scored, on=["traj_id", "step_idx", "action_text"], how="left", maintain_order="left"
    )
    score = joined.get_column("taken_score")
    drop = (score < p.min_score).fill_null(p.unscored == "drop")
    return frames.drop_steps(drop)


class BeforeFirstErrorParams(FilterParams):
    proposer: str | None = Field(
        None, description="Only first errors this intervention proposer located (null: any)."
    )
    unlocated: Literal["drop", "keep"] = Field(
        "drop",
        description="A failed trajectory whose first error no intervention located: drop it "
        "whole, or keep every step.",
    )


@register("before_first_error", BeforeFirstErrorParams)
def before_first_error(frames: Frames, p: BeforeFirstErrorParams) -> Frames:
    """Keep a failed trajectory's steps before its first error: the prefix that was still on
    the task's reference path. Trajectories of another status are untouched.

    The first error is the intervention stage's ``first_error_step`` (page-state replay against
    the reference, :mod:`curation.interventions`): the step whose action left the path; it and
    every later step are dropped (with several interventions, the earliest). ``webloop
    intervene`` locates it, whatever its teacher then proposed or whether the correction was
    verified. A failed trajectory no intervention located an error in is dropped whole
    (``unlocated: drop``) or kept (``keep``)."""
    located = frames.lake.with_ids(
        "__cur_trajs",
        frames.trajectories.get_column("traj_id"),
        f"""
        SELECT traj_id, min(first_error_step) AS first_error
        FROM {Lake.table("interventions")}
        WHERE traj_id IN (SELECT traj_id FROM __cur_trajs) AND first_error_step IS NOT NULL
          AND ($proposer IS NULL OR proposer = $proposer)
        GROUP BY traj_id
        """,
        {"proposer": p.proposer},
    )
    failed = frames.trajectories.filter(pl.col("status") == "failure").get_column("traj_id")
    s = frames.steps.select("traj_id", "step_idx").join(
        located, on="traj_id", how="left", maintain_order="left"
    )
    at_or_after = (s.get_column("step_idx") >= s.get_column("first_error")).fill_null(
        p.unlocated == "drop"
    )
    return frames.drop_steps(s.get_column("traj_id").is_in(failed.implode()) & at_or_after)


class DropInvalidStepsParams(FilterParams):
    noop: StrictBool = Field(
        True,
        description="Also drop no-op steps: the next step's observation (screenshot, or the "
        "accessibility tree without one) and URL are the same as this one's.",
    )


@register("drop_invalid_steps", DropInvalidStepsParams)
def drop_invalid_steps(frames: Frames, p: DropInvalidStepsParams) -> Frames:
    """Drop steps with an action error (``action_error`` not null: the action failed or the
    model output did not parse), steps without an action (``action_text`` null), and, with
    ``noop``, steps whose action changed nothing visible: the NEXT step of the same trajectory
    has the same observation (``obs_hash``: screenshot, or accessibility tree for steps without
    a screenshot) and URL (the last step of a trajectory is never a no-op)."""
    s = frames.steps
    invalid = s.get_column("action_error").is_not_null() | s.get_column("action_text").is_null()
    if p.noop:
        nxt = s.select(
            same=(pl.col("obs_hash") == pl.col("obs_hash").shift(-1))
            & (pl.col("url").eq_missing(pl.col("url").shift(-1)))
            & (pl.col("traj_id") == pl.col("traj_id").shift(-1))
            & (pl.col("step_idx") + 1 == pl.col("step_idx").shift(-1))
        ).get_column("same")
        invalid = invalid | nxt.fill_null(False)
    return frames.drop_steps(invalid)


class DropLoopsParams(FilterParams):
    max_repeats: StrictInt = Field(
        2, ge=1, description="How often one (screenshot, action) pair may occur in a trajectory."
    )


@register("drop_loops", DropLoopsParams)
def drop_loops(frames: Frames, p: DropLoopsParams) -> Frames:
    """Drop repeated-observation loops: within a trajectory, the same (``obs_hash``,
    action_text) pair — the agent on the same screen (or accessibility tree, for steps without a
    screenshot) doing the same thing again — is kept for its first ``max_repeats`` occurrences
    (in step order, counting all stored steps) and dropped after that. Steps without any
    observation hash are never counted as a loop."""
    s = frames.steps
    occurrence = s.select(
        pl.int_range(pl.len()).over(["traj_id", "obs_hash", "action_text"]).alias("n")
    ).get_column("n")
    drop = (occurrence >= p.max_repeats) & s.get_column("obs_hash").is_not_null()
    return frames.drop_steps(drop)
