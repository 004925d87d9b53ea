"""RL data: collected runs → turns with advantages from a registered estimator.

* ``grpo``: the trajectory's reward (its graded status, or its judgment) normalised within its
  group (the G samples of one task), on every turn.
* ``awr``: discounted returns minus a learned value baseline (:func:`value_features` of the state:
  site, position in the trajectory), turned into AWR weights (the update is weighted regression).
* ``step_grpo``: PRM-scored candidate actions at the run's states (``candidates`` +
  ``step_scores``, e.g. from ``webloop score-steps``): each candidate is a turn whose reply is the
  candidate's output, advantage its score normalised within the state.
* ``step_awr``: the same candidates and advantages, as AWR weights (weighted regression).
* ``step_best``: the same candidates; weight 1 on each state's best-scored ones (regression onto
  the best action: DAgger's update with the ``reference`` scorer's labels).
* ``turn``: per-turn rubric progress, from the ``progress`` list a collect run records in each
  trajectory's ``meta`` (bundled sites: share of the task's criteria met after each step).

Trajectories without a reward (``infra_error``, ``timeout``, unjudged) never train.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from training.advantages import compute_advantages, fit_value_baseline
from training.data import rl_turns, run_steps
from training.interface import DataMismatch, Turn
from warehouse.relations import with_relations
from warehouse.store import Warehouse

ESTIMATOR_OPTIONS = {
    "grpo": ("eps",),
    "awr": ("gamma", "beta", "w_max"),
    "step_grpo": ("eps",),
    "step_awr": ("beta", "w_max", "eps"),
    "step_best": ("eps",),
    "turn": ("gamma", "eps"),
}
STEP_LEVEL = frozenset({"step_grpo", "step_awr", "step_best"})
"""Estimators over PRM-scored candidates at the visited states (the RL loop scores them first)."""
WEIGHTED = frozenset({"awr", "step_awr", "step_best"})
"""Estimators whose update is weighted regression (objective ``awr``), not PPO."""


def prepare(
    wh: Warehouse,
    run_ids: Sequence[str],
    estimator: str,
    judge: str | None = None,
    **options: Any,
) -> tuple[list[Turn], dict[str, Any]]:
    """Turns with advantages for ``estimator`` over the runs' trajectories, and counts. With
    ``judge`` (trajectory-level estimators), the rewards are that judge's verdicts."""
    if estimator not in ESTIMATOR_OPTIONS:
        raise DataMismatch(
            f"unknown advantage estimator {estimator!r}; known: {sorted(ESTIMATOR_OPTIONS)}"
        )
    if estimator in STEP_LEVEL:
        frame = candidate_frame(wh, run_ids, options.pop("scorer", None), estimator)
    else:
        frame = run_steps(wh, run_ids, judge)
    rewarded = frame.filter(pl.col("reward").is_not_null())
    stats = {
        "rows": frame.height,
        "rewarded_rows": rewarded.height,
        "trajectories": frame["traj_id"].n_unique() if frame.height else 0,
        "mean_reward": _traj_mean_reward(rewarded),
    }
    if estimator in STEP_LEVEL:  # (the rows' reward is a constant: the trajectories' outcome)
        stats["mean_reward"] = _traj_mean_reward(
            frame.with_columns(reward=(pl.col("status") == "success").cast(pl.Float64))
        )
    if rewarded.is_empty():
        raise DataMismatch(
            f"runs {', '.join(run_ids)}: no rewarded turns ({frame.height} rows; statuses "
            f"{sorted(set(frame['status'].to_list())) if frame.height else []})"
        )
    if estimator == "awr":
        rewarded = with_value(rewarded, options.get("gamma", 1.0))
    elif estimator == "turn":
        rewarded = with_progress(wh, rewarded)
    scored = compute_advantages(estimator, rewarded, **options)  # awr: adds the weight too
    turns = rl_turns(wh, scored)
    stats["turns"] = len(turns)
    stats["nonzero_advantage"] = sum(1 for t in turns if t.advantage != 0.0)
    return turns, stats


def _traj_mean_reward(frame: pl.DataFrame) -> float | None:
    if frame.is_empty():
        return None
    return float(frame.group_by("traj_id").agg(pl.col("reward").first())["reward"].mean())


def value_features(frame: pl.DataFrame) -> np.ndarray:
    """State features of the learned baseline: one-hot site, the turn's position ``t`` and
    ``t / T`` in its trajectory, and ``T`` (longer tasks succeed less often)."""
    sites = sorted({s or "" for s in frame["site"].to_list()})
    onehot = np.array([[float((s or "") == k) for k in sites] for s in frame["site"].to_list()])
    t = frame["step_idx"].to_numpy().astype(np.float64)
    n = frame["n_turns"].to_numpy().astype(np.float64)
    return np.column_stack([onehot, t, t / np.maximum(n, 1.0), n])


def with_value(frame: pl.DataFrame, gamma: float) -> pl.DataFrame:
    """Add ``value``: the ridge baseline fitted to the discounted returns of these turns."""
    t = frame["step_idx"].to_numpy().astype(np.float64)
    n = frame["n_turns"].to_numpy().astype(np.float64)
    returns = gamma ** (n - 1 - t) * frame["reward"].to_numpy().astype(np.float64)
    x = value_features(frame)
    baseline = fit_value_baseline(x, returns)
    return frame.with_columns(value=pl.Series(baseline.predict(x)))


def with_progress(wh: Warehouse, frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``progress`` from the trajectories' recorded per-step criteria progress."""
    meta = wh.sql(
        "SELECT traj_id, meta FROM trajectories WHERE traj_id IN (SELECT unnest(?))",
        [frame["traj_id"].unique().to_list()],
    )
    import json

    progress: dict[tuple[str, int], float] = {}
    for traj_id, m in meta.iter_rows():
        values = (json.loads(m) if isinstance(m, str) else (m or {})).get("progress")
        for i, v in enumerate(values or []):
            progress[(traj_id, i)] = float(v)
    missing = [
        (r["traj_id"], r["step_idx"])
        for r in frame.select("traj_id", "step_idx").iter_rows(named=True)
        if (r["traj_id"], r["step_idx"]) not in progress
    ]
    if missing:
        raise DataMismatch(
            f"estimator 'turn' needs per-step rubric progress; {len(missing)} turns have none "
            f"(e.g. {missing[0][0]} step {missing[0][1]}): collect with the engine's "
            "record_progress on (webloop train rl --estimator turn does, on bundled sites)"
        )
    return frame.with_columns(
        progress=pl.Series(
            [progress[(a, b)] for a, b in frame.select("traj_id", "step_idx").iter_rows()]
        )
    )


def candidate_frame(
    wh: Warehouse, run_ids: Sequence[str], scorer: str | None, estimator: str = "step_grpo"
) -> pl.DataFrame:
    """PRM-scored candidates at the states of the runs' trajectories, as turn rows: the state's
    prompt, the candidate's output as the reply (``model_output``), its score."""
    df = wh.sql(
        with_relations(
            "SELECT s.traj_id, s.step_idx, c.cand_idx, t.run_id, t.task_id, t.group_id, "
            "t.status, k.site, s.prompt_hash, coalesce(c.model_output, 'Action: ' || "
            "c.action_text) AS model_output, NULL::DOUBLE AS logprob, sc.score, sc.scorer "
            "FROM candidates c JOIN latest_step_scores sc USING (traj_id, step_idx, cand_idx) "
            "JOIN steps s USING (traj_id, step_idx) JOIN trajectories t USING (traj_id) "
            "LEFT JOIN trajectory_tasks k USING (traj_id) "
            "WHERE t.run_id IN (SELECT unnest($runs)) AND sc.error IS NULL "
            "AND sc.score IS NOT NULL AND ($scorer IS NULL OR sc.scorer = $scorer) "
            "ORDER BY s.traj_id, s.step_idx, c.cand_idx"
        ),
        {"runs": list(run_ids), "scorer": scorer},
    )
    if df.is_empty():
        raise DataMismatch(
            f"estimator {estimator!r}: no scored candidates at the states of {', '.join(run_ids)} "
            "(run: webloop score-steps --run RUN)"
        )
    if df["scorer"].n_unique() > 1:
        raise DataMismatch(
            f"estimator {estimator!r}: candidates scored by {sorted(df['scorer'].unique())}; "
            "choose one with --scorer"
        )
    # a state's candidates all stand for the same state: the reward of the state is known
    return df.with_columns(reward=pl.lit(1.0), n_turns=pl.lit(1))
