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

import polars as pl

from training.advantages import compute_advantages, estimator_spec
from training.data import rl_turns, run_steps
from training.interface import DataMismatch, Turn
from warehouse.relations import with_relations
from warehouse.store import Warehouse


def prepare(
    wh: Warehouse,
    run_ids: Sequence[str],
    estimator: str,
    judge: str | None = None,
    **options: Any,
) -> tuple[list[Turn], dict[str, Any]]:
    """Turns with advantages for ``estimator`` over the runs' trajectories, and counts. With
    ``judge`` (trajectory-level estimators), the rewards are that judge's verdicts."""
    try:
        spec = estimator_spec(estimator)
    except ValueError as exc:
        raise DataMismatch(str(exc)) from None
    if spec.level == "step":
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
    if spec.level == "step":  # (the rows' reward is a constant: the trajectories' outcome)
        stats["mean_reward"] = _traj_mean_reward(
            frame.with_columns(reward=(pl.col("status") == "success").cast(pl.Float64))
        )
    if rewarded.is_empty():
        raise DataMismatch(
            f"runs {', '.join(run_ids)}: no rewarded turns ({frame.height} rows; statuses "
            f"{sorted(set(frame['status'].to_list())) if frame.height else []})"
        )
    if spec.inputs is not None:  # (awr: the value baseline; turn: the rubric progress)
        rewarded = spec.inputs(wh, rewarded, options)
    scored = compute_advantages(estimator, rewarded, **options)  # awr: adds the weight too
    turns = rl_turns(wh, scored)
    stats["turns"] = len(turns)
    stats["nonzero_advantage"] = sum(1 for t in turns if t.advantage != 0.0)
    return turns, stats


def _traj_mean_reward(frame: pl.DataFrame) -> float | None:
    if frame.is_empty():
        return None
    return float(frame.group_by("traj_id").agg(pl.col("reward").first())["reward"].mean())


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
