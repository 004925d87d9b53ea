"""The dashboard's data: plain functions of a :class:`~warehouse.store.Warehouse`, no Streamlit.

Pages never query the warehouse themselves; they call these through the cached wrappers of
:mod:`dashboards.data`. Analytic queries live in ``dashboards/sql/<name>.sql`` (named ``$param``
parameters; a parameter left out is NULL, which means "no filter"), run by the warehouse's one
query-file runner (:func:`warehouse.store.run_sql_file`), which also defines the shared
relations they name (``trajectory_tasks``, ``latest_judgments``, …:
:mod:`warehouse.relations`); short lookups are inline with parameters. Values never go into SQL
text.

Frames come back as polars frames; a trajectory's whole view as :class:`TrajectoryView`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from warehouse.advantage import group_relative
from warehouse.blobs import BlobError
from warehouse.datasets import COMPOSITION_SCHEMA
from warehouse.datasets import dataset_composition as composition_rows
from warehouse.ids import make_id
from warehouse.records import LABELS, HumanLabel, utcnow
from warehouse.relations import with_relations
from warehouse.store import Warehouse, run_sql_file

SQL_DIR = Path(__file__).parent / "sql"
TABLES = (
    "tasks",
    "runs",
    "trajectories",
    "steps",
    "judgments",
    "step_scores",
    "interventions",
    "human_labels",
    "datasets",
    "training_runs",
    "evaluations",
)


# -- overview ------------------------------------------------------------------------------------


def overview_counts(wh: Warehouse) -> dict[str, int]:
    """Counts for the overview: trajectories by status, steps, judgments, labels, backlogs."""
    row = run_sql_file(wh, SQL_DIR, "overview_counts").row(0, named=True)
    return {k: int(v or 0) for k, v in row.items()}


def success_over_time(wh: Warehouse) -> pl.DataFrame:
    """Per day, suite, split, site and policy: trajectories, successes, rate (see the .sql)."""
    return run_sql_file(wh, SQL_DIR, "success_over_time")


def infra_errors(wh: Warehouse) -> pl.DataFrame:
    return run_sql_file(wh, SQL_DIR, "infra_errors")


# -- trajectories ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TrajectoryFilter:
    """Filters of the trajectory list; ``None`` (or empty) means no filter on that field.

    ``verdict`` applies to ``judge``'s latest verdict (any judge when ``judge`` is None);
    ``'error'`` selects judge errors. ``label`` ``'none'`` selects unlabelled trajectories.
    """

    run: str | None = None
    task: str | None = None
    site: str | None = None
    split: str | None = None
    statuses: tuple[str, ...] = ()
    judge: str | None = None
    verdict: str | None = None
    disagreement: bool | None = None
    label: str | None = None
    limit: int = 500


def trajectory_list(wh: Warehouse, f: TrajectoryFilter = TrajectoryFilter()) -> pl.DataFrame:
    """The trajectories matching ``f``, newest first (at most ``f.limit``)."""
    return run_sql_file(
        wh,
        SQL_DIR,
        "trajectory_list",
        run=f.run or None,
        task=f.task or None,
        site=f.site or None,
        split=f.split or None,
        statuses=list(f.statuses) or None,
        judge=f.judge or None,
        verdict=f.verdict or None,
        disagreement=f.disagreement,
        label=f.label or None,
        limit=f.limit,
    )


def filter_options(wh: Warehouse) -> dict[str, list[str]]:
    """The values each filter can take (runs, sites, splits, statuses, judges)."""

    def values(sql: str) -> list[str]:
        return [v for v in wh.sql(sql).to_series().to_list() if v is not None]

    return {
        "runs": values("SELECT DISTINCT run_id FROM trajectories ORDER BY 1"),
        "sites": values("SELECT DISTINCT site FROM tasks ORDER BY 1"),
        "splits": values("SELECT DISTINCT split FROM tasks ORDER BY 1"),
        "statuses": values("SELECT DISTINCT status FROM trajectories ORDER BY 1"),
        "judges": values("SELECT DISTINCT judge FROM judgments ORDER BY 1"),
    }


@dataclass(frozen=True)
class TrajectoryView:
    """Everything the step viewer shows of one trajectory.

    Attributes:
        trajectory: the trajectory row joined with its task (instruction, site, split) and its
            run's ``coords`` setting (``pixels`` or ``norm1000``), as a dict.
        steps: its steps in order (one row each).
        judgments: every judgment, newest first, with parsed ``criteria``.
        scores: PRM candidates with their latest score per scorer (all steps).
        interventions: proposed corrections.
        labels: human labels, newest first.
    """

    trajectory: dict[str, Any]
    steps: pl.DataFrame
    judgments: list[dict[str, Any]] = field(default_factory=list)
    scores: pl.DataFrame = field(default_factory=pl.DataFrame)
    interventions: pl.DataFrame = field(default_factory=pl.DataFrame)
    labels: pl.DataFrame = field(default_factory=pl.DataFrame)

    def step(self, idx: int) -> dict[str, Any] | None:
        rows = self.steps.filter(pl.col("step_idx") == idx)
        return rows.row(0, named=True) if rows.height else None

    def scores_at(self, idx: int) -> pl.DataFrame:
        if self.scores.is_empty():
            return self.scores
        return self.scores.filter(pl.col("step_idx") == idx).drop("step_idx")


def trajectory_view(wh: Warehouse, traj_id: str) -> TrajectoryView | None:
    """The whole view of ``traj_id``; None when there is no such trajectory."""
    head = wh.sql(
        with_relations(
            "SELECT t.*, k.instruction, k.site, k.split, k.suite, k.start_url, "
            "coalesce(json_extract_string(r.config, '$.coords'), "
            "json_extract_string(r.config, '$.env.coords'), 'pixels') AS coords, "
            "r.status AS run_status FROM trajectories t "
            "LEFT JOIN trajectory_tasks k USING (traj_id) LEFT JOIN runs r ON r.run_id = t.run_id "
            "WHERE t.traj_id = ?"
        ),
        [traj_id],
    )
    if head.is_empty():
        return None
    steps = wh.sql(
        "SELECT step_idx, url, title, screenshot_hash, a11y_hash, model_output, thought, "
        "action, action_text, action_error, latency_model_s, latency_env_s "
        "FROM steps WHERE traj_id = ? ORDER BY step_idx",
        [traj_id],
    )
    judgments = wh.sql(
        "SELECT judge, judge_version, model, verdict, score, criteria, rationale, error, "
        "created_at FROM judgments WHERE traj_id = ? ORDER BY created_at DESC, judge",
        [traj_id],
    ).to_dicts()
    for j in judgments:
        j["criteria"] = _json(j["criteria"]) or []
    scores = wh.sql(
        with_relations(
            "SELECT s.step_idx, s.cand_idx, c.action_text, s.scorer, s.scorer_version, s.score, "
            "s.advantage, s.error FROM latest_step_scores s LEFT JOIN candidates c ON "
            "c.traj_id = s.traj_id AND c.step_idx = s.step_idx AND c.cand_idx = s.cand_idx "
            "WHERE s.traj_id = ? ORDER BY s.step_idx, s.cand_idx, s.scorer"
        ),
        [traj_id],
    )
    interventions = wh.sql(
        "SELECT intervention_id, first_error_step, proposed_action, rationale, proposer, "
        "verified, verified_outcome, created_at FROM interventions WHERE traj_id = ? "
        "ORDER BY created_at DESC",
        [traj_id],
    )
    labels = wh.sql(
        "SELECT label, step_idx, note, reviewer, source, created_at FROM human_labels "
        "WHERE traj_id = ? ORDER BY created_at DESC",
        [traj_id],
    )
    return TrajectoryView(head.row(0, named=True), steps, judgments, scores, interventions, labels)


def screenshot(wh: Warehouse, digest: str | None) -> tuple[bytes | None, str | None]:
    """A screenshot's bytes, or (None, why it cannot be shown): no screenshot recorded, blob
    missing or corrupt."""
    if not digest:
        return None, "no screenshot was recorded for this step"
    try:
        return wh.blobs.get(digest), None
    except BlobError as exc:
        return None, f"screenshot unavailable: {exc}"


def element_box(wh: Warehouse, a11y_hash: str | None, ref: str | None) -> tuple[float, ...] | None:
    """The box ``(x, y, width, height)`` of element ``ref`` in a stored accessibility snapshot
    taken with boxes (``[ref=e12] … [box=x,y,w,h]``); None when not recorded."""
    if not a11y_hash or not ref:
        return None
    try:
        tree = wh.blobs.get_text(a11y_hash)
    except (BlobError, UnicodeDecodeError):
        return None
    pattern = rf"\[ref={re.escape(ref)}\][^\n]*?\[box=([\d.]+),([\d.]+),([\d.]+),([\d.]+)\]"
    m = re.search(pattern, tree)
    return tuple(float(g) for g in m.groups()) if m else None


# -- labels ----------------------------------------------------------------------------------


#: ``human_labels.source`` of labels made from the random queue: the uniformly random sample
#: that prediction-powered success rates may use (``training.evaluate.prediction_powered``).
RANDOM_QUEUE = "random-queue"


def label_queue(
    wh: Warehouse, limit: int = 200, order: str = "priority", seed: int = 0
) -> pl.DataFrame:
    """Unlabelled ended trajectories: disagreements, then low confidence, then the rest; or
    (``order="random"``) in a uniformly random order drawn from ``seed``."""
    if order not in ("priority", "random"):
        raise ValueError(f"order must be 'priority' or 'random', not {order!r}")
    random = order == "random"
    return run_sql_file(wh, SQL_DIR, "label_queue", limit=limit, random=random, seed=seed)


def save_label(
    wh: Warehouse,
    traj_id: str,
    label: str,
    reviewer: str,
    *,
    step_idx: int | None = None,
    note: str | None = None,
    now: dt.datetime | None = None,
    source: str = "dashboard",
) -> HumanLabel:
    """Write a human label through the warehouse API (new rows each time; the latest counts).
    ``source``: where it was made (:data:`RANDOM_QUEUE`: from the random queue).

    The trajectory-level label (``step_idx`` NULL, what agreement metrics read) is returned;
    ``step_idx``, the first wrong step, adds a step-level ``failure`` label at that step.
    Raises ValueError naming the field for a bad label, an empty reviewer, an unknown
    trajectory or a step outside it."""
    if label not in LABELS:
        raise ValueError(f"label must be one of {', '.join(LABELS)}, not {label!r}")
    reviewer = (reviewer or "").strip()
    if not reviewer:
        raise ValueError("reviewer: say who is labelling (a name or handle)")
    n = wh.sql("SELECT n_steps FROM trajectories WHERE traj_id = ?", [traj_id])
    if n.is_empty():
        raise ValueError(f"traj_id: no trajectory {traj_id!r} in the warehouse")
    if step_idx is not None and not 0 <= step_idx < max(int(n.item() or 0), 1):
        raise ValueError(f"first wrong step {step_idx} is outside the trajectory's steps")
    now = now or utcnow()
    note = (note or "").strip() or None
    rows = [
        HumanLabel(
            label_id=make_id("label", traj_id, reviewer, None, now.isoformat()),
            traj_id=traj_id,
            label=label,
            reviewer=reviewer,
            note=note,
            source=source,
            created_at=now,
        )
    ]
    if step_idx is not None:  # the first wrong step: a step-level failure label beside it
        rows.append(
            HumanLabel(
                label_id=make_id("label", traj_id, reviewer, step_idx, now.isoformat()),
                traj_id=traj_id,
                label="failure",
                reviewer=reviewer,
                step_idx=step_idx,
                note="first wrong step" + (f": {note}" if note else ""),
                source=source,
                created_at=now,
            )
        )
    wh.write(rows)
    return rows[0]


# -- groups ----------------------------------------------------------------------------------


def group_list(wh: Warehouse, run: str | None = None, limit: int = 500) -> pl.DataFrame:
    return run_sql_file(wh, SQL_DIR, "group_list", run=run, limit=limit)


def group_members(wh: Warehouse, group_id: str) -> pl.DataFrame:
    """The samples of one group, best reward first, with their GRPO advantage
    (:func:`warehouse.advantage.group_relative` over the rewarded samples, rounded to 4
    places) and final screenshot."""
    df = run_sql_file(wh, SQL_DIR, "group_members", group=group_id)
    advantage = df.select(group_relative(pl.col("reward").cast(pl.Float64)).round(4))
    return df.insert_column(
        df.columns.index("reward") + 1, advantage.to_series().alias("advantage")
    )


# -- judges ----------------------------------------------------------------------------------


def agreements(wh: Warehouse) -> pl.DataFrame:
    """The stored calibration metrics (latest per judge, version, reference and site)."""
    return wh.sql(
        "SELECT judge, judge_version, reference, coalesce(site, 'all') AS site, n, accuracy, "
        "precision, recall, f1, kappa, judge_success_rate, reference_success_rate, "
        "success_rate_gap, created_at FROM agreements QUALIFY row_number() OVER (PARTITION BY "
        "judge, judge_version, reference, site ORDER BY created_at DESC) = 1 "
        "ORDER BY judge, judge_version, reference, site NULLS FIRST"
    )


def protocol_comparisons(wh: Warehouse) -> pl.DataFrame:
    """The stored side-by-side protocol tables (``webloop eval protocols RUN``): per run, the
    latest row of each protocol (``other`` empty: its success on the trajectories every
    protocol judged), each pair of protocols and each protocol against the human labels."""
    return wh.sql(
        "SELECT run_id, protocol, protocol_hash, model, other, n, successes, rate, ci_low, "
        "ci_high, other_successes, agree, only_this, only_other, kappa, mcnemar_p, created_at "
        "FROM protocol_comparisons QUALIFY row_number() OVER (PARTITION BY comparison_id "
        "ORDER BY created_at DESC) = 1 ORDER BY run_id, other NULLS FIRST, protocol, other"
    )


def judge_flips(wh: Warehouse) -> pl.DataFrame:
    return run_sql_file(wh, SQL_DIR, "judge_flips")


def judge_disagreements(wh: Warehouse, limit: int = 500) -> pl.DataFrame:
    return run_sql_file(wh, SQL_DIR, "judge_disagreements", limit=limit)


def judge_errors(wh: Warehouse) -> pl.DataFrame:
    return wh.sql(
        "SELECT judge, judge_version, count(*) AS errors, any_value(error) AS example "
        "FROM judgments WHERE error IS NOT NULL GROUP BY ALL ORDER BY errors DESC, judge"
    )


# -- datasets, training, evaluations ---------------------------------------------------------


def datasets(wh: Warehouse) -> pl.DataFrame:
    return wh.sql(
        "SELECT dataset_id, name, snapshot_id, recipe, counts, export_path, data_card, "
        "recipe_hash, created_at FROM datasets ORDER BY created_at DESC, dataset_id"
    )


def dataset_composition(wh: Warehouse, dataset_id: str) -> pl.DataFrame:
    """:func:`warehouse.datasets.dataset_composition` (what the curate flow's artifact shows)
    as a frame."""
    return pl.DataFrame(composition_rows(wh, dataset_id), schema=COMPOSITION_SCHEMA, orient="row")


def lineage(wh: Warehouse) -> pl.DataFrame:
    return run_sql_file(wh, SQL_DIR, "lineage")


def training_runs(wh: Warehouse) -> pl.DataFrame:
    return wh.sql(
        "SELECT training_run_id, stage, base_model, dataset_id, status, started_at, ended_at "
        "FROM training_runs ORDER BY created_at DESC, training_run_id"
    )


def metrics(wh: Warehouse, training_run_id: str) -> pl.DataFrame:
    """step × metric name → value of one run (long format)."""
    return wh.sql(
        "SELECT step, name, value FROM metrics WHERE training_run_id = ? ORDER BY step, name",
        [training_run_id],
    )


def checkpoints(wh: Warehouse) -> pl.DataFrame:
    return wh.sql(
        "SELECT checkpoint_id, training_run_id, step, path, created_at FROM checkpoints "
        "ORDER BY training_run_id, step"
    )


def evaluations(wh: Warehouse) -> pl.DataFrame:
    """Evaluations with the per-site breakdown flattened: one row per checkpoint (or policy),
    split and site ('all' for the whole split), with its interval."""
    rows = wh.sql(
        "SELECT coalesce(checkpoint_id, policy, '?') AS model, suite, split, n, n_success, "
        "success_rate, ci_low, ci_high, breakdown, created_at FROM evaluations "
        "ORDER BY created_at, model, split"
    )
    out: list[dict[str, Any]] = []
    for r in rows.iter_rows(named=True):
        base = {k: r[k] for k in ("model", "suite", "split")}
        out.append({**base, "site": "all", **_rate(r)})
        for site, b in _sites(_json(r["breakdown"])).items():
            out.append({**base, "site": site, **_rate(b)})
    schema = {
        "model": pl.Utf8,
        "suite": pl.Utf8,
        "split": pl.Utf8,
        "site": pl.Utf8,
        "n": pl.Int64,
        "n_success": pl.Int64,
        "success_rate": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
    }
    return pl.DataFrame(out, schema=schema, orient="row")


def table_counts(wh: Warehouse) -> dict[str, int]:
    return {t: int(wh.sql(f"SELECT count(*) FROM {t}").item()) for t in TABLES}


# -- helpers ---------------------------------------------------------------------------------


def _json(text: Any) -> Any:
    if text is None or not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _sites(breakdown: Any) -> dict[str, dict[str, Any]]:
    """The per-site rows of an evaluation's ``breakdown`` as the evaluation stage stores it
    (``{"site": [{"site": …, "n": …, "n_success": …, "rate": …, "ci_low": …, "ci_high": …}]}``);
    anything else gives nothing."""
    rows = breakdown.get("site") if isinstance(breakdown, dict) else None
    if not isinstance(rows, list):
        return {}
    return {
        str(r.get("site")): r for r in rows if isinstance(r, dict) and isinstance(r.get("n"), int)
    }


def _rate(r: dict[str, Any]) -> dict[str, Any]:
    n, k = r.get("n"), r.get("n_success")
    rate = r.get("success_rate", r.get("rate"))
    if rate is None and n:
        rate = (k or 0) / n
    return {
        "n": n,
        "n_success": k,
        "success_rate": rate,
        "ci_low": r.get("ci_low"),
        "ci_high": r.get("ci_high"),
    }
