"""Quality gates: Great Expectations suites over the rendered examples and their source rows.

Every gate is one expectation on one small frame (polars → pandas, a GX ephemeral context;
great_expectations is imported here, lazily, only when gates run: its import costs ~4 s):

==================  ==========================================================================
gate                what must hold
==================  ==========================================================================
instruction         every selected trajectory's task has a non-empty instruction
target parses       every example target (SFT completion) parses in the action grammar
step action parses  every kept step's recorded action parses
blob exists         every screenshot / tree the examples reference is in the blob store
image decodes       every referenced screenshot is a whole PNG/JPEG/WebP image
contiguous steps    each trajectory's steps are 0..n_steps-1, none missing
success rate        the selected trajectories' success rate lies in ``recipe.gates.success_rate``:
                    successes by the recipe's ``verdict`` judges where it has one
                    (:func:`recipe_successes`), else by the trajectories' own outcome
leakage split       (training datasets) no task of split test/ood
leakage near-dup    (training datasets) no instruction that is a near duplicate
                    (:func:`curation.embed.near_duplicates`) of a test/ood task's instruction
                    (instances of one template with other parameters are distinct tasks:
                    :func:`curation.embed.distinct_instances`)
==================  ==========================================================================

A dataset is a training dataset unless its recipe selects test or ood splits on purpose
(``sources.splits``), i.e. an evaluation set. A failing gate raises :class:`GateError` naming
the failed gates (with counts and a few offending values) and the GX data docs it built.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from curation.examples import Examples
from curation.filters import Lake, judged
from warehouse.connection import LAKE
from warehouse.relations import outcome_sql
from warehouse.store import Warehouse

HELD_OUT = ("test", "ood")


class GateError(RuntimeError):
    """A quality gate failed; ``failed`` names the gates, ``docs`` the data docs index."""

    def __init__(self, failed: list[str], docs: Path | None) -> None:
        self.failed, self.docs = failed, docs
        where = f"; data docs: {docs}" if docs else ""
        super().__init__(f"quality gates failed: {'; '.join(failed)}{where}")


@dataclass
class GateResult:
    gate: str
    success: bool
    checked: int
    unexpected: int
    examples: list[Any] = field(default_factory=list)


@dataclass
class Check:
    """One expectation over one frame: ``kind`` is the GX expectation class name."""

    gate: str
    frame: str
    kind: str
    kwargs: dict[str, Any]


def is_training(recipe: Any) -> bool:
    """False for an evaluation set: a recipe that selects test/ood splits on purpose."""
    splits = getattr(recipe.sources, "splits", None) or ["train"]
    return not any(s in HELD_OUT for s in splits)


def held_out_tasks(wh: Warehouse, snapshot_id: int) -> pl.DataFrame:
    """task_id, split, instruction of every test/ood task (latest version) at the snapshot."""
    return wh.sql(
        f"SELECT task_id, split, instruction FROM {LAKE}.tasks AT (VERSION => $v) "
        "WHERE split IN ('test', 'ood') "
        "QUALIFY version = max(version) OVER (PARTITION BY task_id) ORDER BY task_id",
        {"v": snapshot_id},
    )


def task_keys(
    wh: Warehouse, task_ids: Sequence[str], snapshot_id: int
) -> dict[str, tuple[str, str] | None]:
    """task_id → :func:`curation.embed.template_key` of its latest version at the snapshot."""
    from curation.filters import Lake, task_template_keys

    return task_template_keys(Lake(wh, snapshot_id), sorted(set(task_ids)))


def near_test_tasks(
    tasks: pl.DataFrame,
    held: pl.DataFrame,
    threshold: float | None = None,
    keys: dict[str, tuple[str, str] | None] | None = None,
) -> pl.DataFrame:
    """``tasks`` (task_id, instruction) with ``near_test_task``: the held-out task whose
    instruction is a near duplicate (null: none), ``similarity`` its cosine. ``keys``
    (:func:`task_keys`) tells instances of one template with other parameters apart."""
    from curation import embed

    thr = embed.DEFAULT_THRESHOLD if threshold is None else threshold
    out = tasks.select("task_id", "instruction").unique("task_id").sort("task_id")
    near: list[str | None] = [None] * out.height
    sim: list[float | None] = [None] * out.height
    if out.height and held.height:
        mine = out.get_column("task_id").to_list()
        ours = [s or "" for s in out.get_column("instruction").to_list()]
        theirs = held.get_column("instruction").to_list()
        ids = held.get_column("task_id").to_list()
        for i, j, s in embed.near_duplicates(ours, theirs, thr):
            if mine[i] == ids[j]:
                continue  # the task itself: the split gate's business
            if keys and embed.distinct_instances(keys.get(mine[i]), keys.get(ids[j])):
                continue  # one template, other parameters: another task, not a copy
            if sim[i] is None or s > sim[i]:
                near[i], sim[i] = ids[j], float(s)
    return out.with_columns(
        pl.Series("near_test_task", near, dtype=pl.Utf8),
        pl.Series("similarity", sim, dtype=pl.Float64),
    )


def recipe_successes(
    wh: Warehouse, recipe: Any, traj_ids: pl.Series, snapshot_id: int
) -> pl.Series:
    """The ids among ``traj_ids`` that count as successes for ``recipe``'s success-rate gate:
    where the recipe keeps a judge's successes (its first ``verdict: success`` filter), that
    filter's judges by its rule (:func:`curation.filters.judged`: the gate and the filter agree
    whatever the judge); otherwise the trajectories' own outcome (their status; a ``finished``
    one its judges' verdict: :func:`warehouse.relations.outcome_sql`, the rule evaluations
    read)."""
    lake = Lake(wh, snapshot_id)
    for spec in recipe.filters:
        if spec.name == "verdict" and spec.params.verdict == "success":
            return judged(lake, traj_ids, spec.params)
    status, join = outcome_sql(None)
    df = lake.with_ids(
        "__gate_trajs",
        traj_ids,
        f"SELECT t.traj_id FROM {Lake.table('trajectories', 't')} {join} "
        f"WHERE t.traj_id IN (SELECT traj_id FROM __gate_trajs) AND {status} = 'success'",
    )
    return df.get_column("traj_id")


def gate_frames(
    ex: Examples,
    trajectories: pl.DataFrame,
    tasks: pl.DataFrame,
    held: pl.DataFrame | None,
    keys: dict[str, tuple[str, str] | None] | None = None,
    successes: pl.Series | None = None,
) -> dict[str, pl.DataFrame]:
    """The frames the checks run on (``held``: held-out tasks, None = no leakage gates;
    ``keys``: :func:`task_keys` of both, for the near-duplicate gate; ``successes``: the ids
    the success-rate gate counts (:func:`recipe_successes`; None: status ``success``))."""
    success = (
        pl.col("status") == "success"
        if successes is None
        else pl.col("traj_id").is_in(successes.implode())
    )
    frames = {
        "trajectories": trajectories.select(
            "traj_id",
            "task_id",
            "split",
            "status",
            pl.col("instruction").fill_null("").str.strip_chars().str.len_chars().alias("chars"),
            success.cast(pl.Float64).alias("success"),
        ),
        "targets": ex.target_checks,
        "step_actions": ex.step_checks,
        "blobs": ex.blob_checks,
        "screenshots": ex.blob_checks.filter(pl.col("role") == "screenshot"),
        "step_index": ex.step_index,
    }
    if held is not None:
        # a task's split is the held-out one if any version of it is test/ood now
        held_split = held.select("task_id", pl.col("split").alias("held_split"))
        frames["tasks"] = (
            tasks.select("task_id", "split")
            .unique("task_id")
            .join(held_split, on="task_id", how="left")
            .with_columns(pl.coalesce("held_split", "split").alias("split"))
            .drop("held_split")
            .sort("task_id")
        )
        frames["near"] = near_test_tasks(tasks, held, keys=keys)
    return frames


_IN, _NULL = "ExpectColumnValuesToBeInSet", "ExpectColumnValuesToBeNull"
_CHECKS = (  # gate, frame, expectation, kwargs
    ("instruction", "trajectories", "ExpectColumnValuesToBeBetween", {"column": "chars"}),
    ("target parses", "targets", _IN, {"column": "parses", "value_set": [True]}),
    ("step action parses", "step_actions", _IN, {"column": "parses", "value_set": [True]}),
    ("blob exists", "blobs", _IN, {"column": "exists", "value_set": [True]}),
    ("image decodes", "screenshots", _NULL, {"column": "reason"}),
    ("contiguous steps", "step_index", _IN, {"column": "contiguous", "value_set": [True]}),
)
_LEAKAGE = (
    ("leakage split", "tasks", "ExpectColumnValuesToNotBeInSet", {"column": "split"}),
    ("leakage near-duplicate", "near", _NULL, {"column": "near_test_task"}),
)


def checks(recipe: Any, training: bool) -> list[Check]:
    """The gates of ``recipe`` (leakage gates only for training datasets)."""
    lo, hi = recipe.gates.success_rate
    out = [Check(g, f, k, dict(kw)) for g, f, k, kw in _CHECKS]
    out[0].kwargs["min_value"] = 1
    rate = {"column": "success", "min_value": float(lo), "max_value": float(hi)}
    out.append(Check("success rate", "trajectories", "ExpectColumnMeanToBeBetween", rate))
    if training:
        out += [Check(g, f, k, dict(kw)) for g, f, k, kw in _LEAKAGE]
        out[-2].kwargs["value_set"] = list(HELD_OUT)
    return out


_OFFENDER = {  # the column that names an offending row in a failure message
    "trajectories": "traj_id",
    "targets": "completion",
    "step_actions": "action_text",
    "blobs": "hash",
    "screenshots": "hash",
    "step_index": "traj_id",
    "tasks": "task_id",
    "near": "task_id",
}


def run_gates(
    frames: dict[str, pl.DataFrame], check_list: Sequence[Check], docs_dir: Path
) -> list[GateResult]:
    """Validate every check with GX; on any failure build the data docs into ``docs_dir`` and
    raise :class:`GateError`. Checks over an empty frame pass trivially, except the success
    rate (an empty selection never reaches the gates)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    for name in ("great_expectations", "great_expectations.core"):
        logging.getLogger(name).setLevel(logging.ERROR)
    ctx = gx.get_context(mode="ephemeral")
    _quiet(ctx)
    source = ctx.data_sources.add_pandas("webloop")
    results: list[GateResult] = []
    for fname in sorted({c.frame for c in check_list}):
        mine = [c for c in check_list if c.frame == fname]
        frame = frames[fname]
        if frame.is_empty():
            results += [GateResult(c.gate, True, 0, 0) for c in mine]
            continue
        batch = source.add_dataframe_asset(fname).add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add(gx.ExpectationSuite(name=f"webloop_{fname}"))
        for c in mine:
            suite.add_expectation(getattr(gxe, c.kind)(**c.kwargs, meta={"gate": c.gate}))
        vd = ctx.validation_definitions.add(
            gx.ValidationDefinition(name=f"validate_{fname}", data=batch, suite=suite)
        )
        res = vd.run(
            batch_parameters={"dataframe": frame.to_pandas()},
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5},
        )
        for r in res.results:
            gate = (r.expectation_config.meta or {}).get("gate", r.expectation_config.type)
            detail = r.result or {}
            unexpected = int(detail.get("unexpected_count") or 0)
            examples = list(detail.get("partial_unexpected_list") or [])
            if not examples and "observed_value" in detail:
                examples = [detail["observed_value"]]
            results.append(
                GateResult(gate, bool(r.success), frame.height, unexpected, examples[:5])
            )
    failed = [r for r in results if not r.success]
    if failed:
        docs = _build_docs(ctx, docs_dir)
        raise GateError([_describe(r, check_list, frames) for r in failed], docs)
    return results


def _describe(r: GateResult, check_list: Sequence[Check], frames: dict[str, pl.DataFrame]) -> str:
    c = next(c for c in check_list if c.gate == r.gate)
    if c.kind == "ExpectColumnMeanToBeBetween":
        lo, hi = c.kwargs["min_value"], c.kwargs["max_value"]
        observed = r.examples[0] if r.examples else None
        return f"{r.gate}: {observed} not in [{lo}, {hi}] over {r.checked} rows"
    frame = frames[c.frame]
    name = _OFFENDER.get(c.frame)
    col = c.kwargs["column"]
    bad = _bad_rows(frame, c)
    shown = bad.get_column(name).head(3).to_list() if name and bad.height else r.examples[:3]
    extra = ""
    if c.frame == "near" and bad.height:
        pairs = bad.select("task_id", "near_test_task").head(3).iter_rows()
        shown = [f"{a}~{b}" for a, b in pairs]
    elif col != name and name:
        extra = f" ({col})"
    return f"{r.gate}: {r.unexpected} of {r.checked} rows{extra}, e.g. {shown}"


def _bad_rows(frame: pl.DataFrame, c: Check) -> pl.DataFrame:
    col = pl.col(c.kwargs["column"])
    if c.kind == "ExpectColumnValuesToBeInSet":
        return frame.filter(~col.is_in(c.kwargs["value_set"]) | col.is_null())
    if c.kind == "ExpectColumnValuesToNotBeInSet":
        return frame.filter(col.is_in(c.kwargs["value_set"]))
    if c.kind == "ExpectColumnValuesToBeNull":
        return frame.filter(col.is_not_null())
    if c.kind == "ExpectColumnValuesToBeBetween":
        return frame.filter(col < c.kwargs["min_value"])
    return frame.head(0)


def _quiet(ctx: Any) -> None:
    """No progress bars (they would go to the user's terminal)."""
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    except Exception:  # an older/newer GX without the setting: bars are cosmetic
        pass


def _build_docs(ctx: Any, docs_dir: Path) -> Path | None:
    """GX data docs (suites and validation results) as static HTML under ``docs_dir``."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    ctx.add_data_docs_site(
        site_name="webloop",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(docs_dir),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    ctx.build_data_docs(site_names=["webloop"])
    index = docs_dir / "index.html"
    return index if index.exists() else None
