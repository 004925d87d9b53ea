"""Evaluation: success rates with 95% Wilson intervals per split, site and difficulty, and the
difference between two evaluations with its interval: paired (exact McNemar, a template-clustered
bootstrap) when both ran the same tasks, Newcombe's unpaired interval otherwise.

An evaluation summarises the trajectories of one collect run (the policy on a split's tasks).
Outcomes: ``success`` counts 1; ``failure`` and ``timeout`` (the policy ran out of time or steps)
count 0; ``infra_error`` (the browser or model server failed) is no outcome of the policy and is
left out of ``n`` — it is counted separately, so a broken machine cannot pass as a bad policy.
Trajectories still ``finished`` (live web, not judged yet) are left out and counted the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from training.stats import (
    breakdown,
    cluster_bootstrap,
    diff_interval,
    mcnemar_exact,
    ppi_mean,
    stratified_bootstrap,
    wilson,
)
from warehouse.ids import make_id
from warehouse.records import Evaluation
from warehouse.relations import outcome_sql, with_relations
from warehouse.store import Warehouse

OUTCOME = {"success": 1, "failure": 0, "timeout": 0}


def run_outcomes(wh: Warehouse, run_id: str, judge: str | None = None) -> pl.DataFrame:
    """One row per trajectory of the run: task, suite, site, difficulty, split, template (of the
    task version it ran; null where the task has none), status, success (null where the status
    is no outcome). A ``finished``
    trajectory takes its judges' verdict (``trajectory_verdicts`` of
    :mod:`warehouse.relations`).

    With ``judge``, every trajectory's outcome is that judge's latest verdict; one the judge
    could not decide is left out under ``judge_error`` (or ``unjudged``, ``judge_<verdict>``),
    never counted a failure; infrastructure errors and running trajectories stay left out."""
    status, verdicts = outcome_sql(judge)
    df = wh.sql(
        with_relations(
            "SELECT t.traj_id, t.task_id, k.suite, k.site, k.difficulty, k.split, "
            "json_extract_string(k.meta, '$.template') AS template, "
            f"{status} AS status FROM trajectories t "
            f"LEFT JOIN trajectory_tasks k USING (traj_id) {verdicts} "
            "WHERE t.run_id = $run ORDER BY t.traj_id"
        ),
        {"run": run_id, **({"judge": judge} if judge is not None else {})},
    )
    return df.with_columns(
        success=pl.col("status").replace_strict(OUTCOME, default=None, return_dtype=pl.Int64)
    )


@dataclass(frozen=True)
class Summary:
    n: int
    n_success: int
    rate: float
    ci_low: float
    ci_high: float
    excluded: dict[str, int]  # status → trajectories left out (infra_error, finished, running)
    by_site: list[dict[str, Any]]
    by_difficulty: list[dict[str, Any]]
    # the 95% interval resampling task templates whole (tasks of a template succeed or fail
    # together: the Wilson interval, which counts every task as independent, is too narrow);
    # None with fewer than two templates
    clustered: dict[str, Any] | None = None
    # the 95% interval resampling tasks within each template (the suite's templates fixed: new
    # tasks of these templates); None with fewer than two templates
    within: dict[str, Any] | None = None


def summarize(outcomes: pl.DataFrame) -> Summary:
    """Overall success with its Wilson interval, and per site and per difficulty."""
    scored = outcomes.filter(pl.col("success").is_not_null())
    excluded = outcomes.filter(pl.col("success").is_null()).group_by("status").len().sort("status")
    n, k = scored.height, int(scored["success"].sum() or 0)
    lo, hi = wilson(k, n) if n else (0.0, 1.0)
    clustered = within = None
    if "template" in scored.columns and n:
        templates = scored["template"].fill_null(scored["task_id"]).to_list()
        if len(set(templates)) > 1:
            values = scored["success"].to_list()
            c_lo, c_hi = cluster_bootstrap(values, templates)
            clustered = {"ci_low": c_lo, "ci_high": c_hi, "clusters": len(set(templates))}
            w_lo, w_hi = stratified_bootstrap(values, templates)
            within = {"ci_low": w_lo, "ci_high": w_hi, "templates": len(set(templates))}
    return Summary(
        clustered=clustered,
        within=within,
        n=n,
        n_success=k,
        rate=k / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        excluded=dict(excluded.iter_rows()),
        by_site=_rows(scored, "site"),
        by_difficulty=_rows(scored, "difficulty"),
    )


def _rows(scored: pl.DataFrame, by: str) -> list[dict[str, Any]]:
    if scored.is_empty():
        return []
    return breakdown(scored, [by]).sort(by).to_dicts()


def evaluation_id_for(run_id: str, judge: Any = None) -> str:
    """An evaluation's id: from its collect run, and the judge's identity when a judge decided
    its outcomes (the same rollouts judged otherwise are another evaluation)."""
    return make_id("eval", run_id) if judge is None else make_id("eval", run_id, judge)


def record(
    wh: Warehouse,
    run_id: str,
    *,
    suite: str,
    split: str,
    policy: str,
    checkpoint_id: str | None,
    extra: dict[str, Any] | None = None,
    judge: str | None = None,
    judge_identity: Any = None,
    exact_judge: bool = False,
) -> tuple[Evaluation, Summary]:
    """Summarise the run's trajectories and store the evaluation (id from the run: re-running
    an evaluation replaces its row with the same numbers). A judge's rate is debiased by the
    human labels (prediction-powered) unless it is ``exact_judge`` (it reads the checkers)."""
    outcomes = run_outcomes(wh, run_id, judge)
    s = summarize(outcomes)
    debiased = prediction_powered(wh, outcomes) if judge and not exact_judge else None
    if debiased is not None:
        extra = {**(extra or {}), "ppi": debiased}
    ev = Evaluation(
        evaluation_id=evaluation_id_for(run_id, judge_identity if judge else None),
        judge=judge,
        suite=suite,
        split=split,
        n=s.n,
        n_success=s.n_success,
        success_rate=s.rate,
        checkpoint_id=checkpoint_id,
        policy=policy,
        run_id=run_id,
        ci_low=s.ci_low,
        ci_high=s.ci_high,
        breakdown={
            "site": s.by_site,
            "difficulty": s.by_difficulty,
            "excluded": s.excluded,
            "clustered": s.clustered,
            "within": s.within,
            **(extra or {}),
        },
    )
    wh.write([ev])
    return ev, s


#: The labels of the dashboard's random labelling queue (``dashboards.queries.RANDOM_QUEUE``).
RANDOM_SAMPLE = "random-queue"


def human_outcomes(
    wh: Warehouse, traj_ids: list[str], source: str | None = RANDOM_SAMPLE
) -> dict[str, int]:
    """traj_id → 1/0 from each trajectory's latest whole-trajectory human label (success or
    failure; other labels, such as ``not_executable``, are no outcome) made from ``source``
    (default: the random queue, whose labels are a uniformly random sample; None: any)."""
    if not traj_ids:
        return {}
    df = wh.sql(
        with_relations(
            "SELECT traj_id, label FROM latest_human_labels WHERE traj_id IN (SELECT unnest($ids)) "
            "AND ($source IS NULL OR source = $source)"
        ),
        {"ids": traj_ids, "source": source},
    )
    return {t: int(lab == "success") for t, lab in df.iter_rows() if lab in ("success", "failure")}


def prediction_powered(wh: Warehouse, judged: pl.DataFrame) -> dict[str, Any] | None:
    """A judged evaluation's success rate debiased by human labels (:func:`ppi_mean`): the
    judge's verdicts on every scored trajectory, its error on those a person labelled from the
    dashboard's random queue (a uniformly random sample; labels of the disagreement-first
    queue would bias it and are not used). None with fewer than 2 such labels."""
    scored = judged.filter(pl.col("success").is_not_null())
    labels = human_outcomes(wh, scored["traj_id"].to_list())
    if len(labels) < 2 or scored.height < 2:
        return None
    verdict = dict(zip(scored["traj_id"], scored["success"], strict=True))
    ids = sorted(labels)
    theta, lo, hi = ppi_mean(
        scored["success"].to_list(), [verdict[t] for t in ids], [labels[t] for t in ids]
    )
    agree = sum(verdict[t] == labels[t] for t in ids)
    return {
        "rate": theta,
        "ci_low": lo,
        "ci_high": hi,
        "n": scored.height,
        "n_labelled": len(ids),
        "judge_rate": float(scored["success"].mean()),
        "labelled_agreement": agree / len(ids),
    }


def find_evaluation(wh: Warehouse, ref: str) -> dict[str, Any]:
    """An evaluation by id, or the newest of a checkpoint id / collect run id."""
    df = wh.sql(
        "SELECT * FROM evaluations WHERE evaluation_id = $q OR checkpoint_id = $q OR run_id = $q "
        "ORDER BY (evaluation_id = $q) DESC, created_at DESC LIMIT 1",
        {"q": ref},
    )
    if df.is_empty():
        raise LookupError(f"no evaluation, checkpoint or run {ref!r} among the evaluations")
    return df.row(0, named=True)


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """B − A: how much better evaluation ``b`` succeeds than evaluation ``a``.

    ``a`` and ``b`` are evaluations as dicts: a stored ``evaluations`` row
    (:func:`find_evaluation`) or a run's summary (the flywheel's ``before`` / ``after``). Each
    needs ``n``, ``n_success``, ``ci_low``, ``ci_high`` (its Wilson interval); ``evaluation_id``,
    ``suite`` and ``split`` are used when present. Returns:

    - ``diff``: ``p_b − p_a`` with ``p = n_success / n``;
    - ``ci_low``, ``ci_high``: Newcombe's 95% interval of ``diff``
      (:func:`training.stats.diff_interval`);
    - ``separated``: the two Wilson intervals do not overlap;
    - ``a``, ``b``: their evaluation ids (None when absent);
    - ``rate_a``, ``rate_b``: ``p_a``, ``p_b``;
    - ``same_split``: both on the same suite and split (None when either does not say).
    """
    d, lo, hi = diff_interval(a["n_success"], a["n"], b["n_success"], b["n"])
    split_a, split_b = (a.get("suite"), a.get("split")), (b.get("suite"), b.get("split"))
    known = None not in (*split_a, *split_b)
    return {
        "a": a.get("evaluation_id"),
        "b": b.get("evaluation_id"),
        "rate_a": a["n_success"] / a["n"],
        "rate_b": b["n_success"] / b["n"],
        "diff": d,
        "ci_low": lo,
        "ci_high": hi,
        "separated": a["ci_high"] < b["ci_low"] or b["ci_high"] < a["ci_low"],
        "same_split": split_a == split_b if known else None,
    }


def per_task(outcomes: pl.DataFrame) -> pl.DataFrame:
    """One row per task of an evaluation's outcomes: site, template (the task itself where
    none), ``n`` scored trajectories and ``success`` (their mean; null when none was scored)."""
    return (
        outcomes.group_by("task_id")
        .agg(
            pl.col("site").first(),
            pl.col("template").first(),
            pl.col("success").count().alias("n"),
            pl.col("success").mean().alias("success"),
        )
        .with_columns(pl.col("template").fill_null(pl.col("task_id")))
        .sort("task_id")
    )


class ProtocolMismatch(ValueError):
    """Two evaluations were made under different protocols (judge, prompts, parser, decoding):
    their numbers do not measure the same thing."""


def protocol_of(ev: dict[str, Any]) -> dict[str, Any] | None:
    """An evaluation row's recorded protocol (None: recorded before protocols were)."""
    breakdown = ev.get("breakdown") or {}
    if isinstance(breakdown, str):
        breakdown = json.loads(breakdown)
    return breakdown.get("protocol")


def protocol_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple] | None:
    """``{field: (A's, B's)}`` where the two protocols differ; None when either is unknown."""
    pa, pb = protocol_of(a), protocol_of(b)
    if pa is None or pb is None:
        return None
    return {k: (pa.get(k), pb.get(k)) for k in sorted({*pa, *pb}) if pa.get(k) != pb.get(k)}


def compare_evaluations(
    wh: Warehouse,
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    force: bool = False,
    common_tasks: bool = False,
    n_boot: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """B − A for two stored evaluations (:func:`find_evaluation` rows), paired when they can be.

    Paired: both rolled out the same tasks (their runs' task sets are equal). Each task scored
    in both is a pair (one scored in one only, an infrastructure error, is left out and counted
    in ``unpaired_tasks``); ``diff`` is the mean of B's minus A's per-task success; the 95%
    interval is a percentile bootstrap that resamples task templates whole (tasks of a template
    succeed or fail together: per-task resampling would overstate the precision for new
    templates); ``within_low`` / ``within_high``: the percentile bootstrap that resamples tasks
    within each template (the templates fixed: the interval for new tasks of these templates,
    the primary one for a fixed suite, beside McNemar); with one
    outcome per task and evaluation, ``mcnemar_p`` is the exact McNemar test over the pairs
    only A solved (``a_only``) and only B solved (``b_only``). ``by_site`` / ``by_template``:
    the same per group. Otherwise (different task sets): :func:`compare`'s Newcombe interval
    of two independent samples, ``method: unpaired`` and ``unpaired_because`` saying why.
    Both keep :func:`compare`'s fields (``rate_a``, ``rate_b``, ``same_split`` …).

    Protocols (:func:`stages.evaluate.protocol`: judge, prompts, parser, decoding, budgets):
    when both are recorded and differ, :class:`ProtocolMismatch` names the fields, unless
    ``force`` (then ``protocol_differs`` holds them); ``protocol_known`` says whether both were
    recorded.

    ``common_tasks``: when the task sets differ but share tasks (e.g. one evaluation ran the
    first 100 of the same seeded order as the other's 300), pair on the shared tasks;
    ``tasks_left_out`` counts the tasks only one of them ran."""
    differs = protocol_differences(a, b)
    if differs and not force:
        fields = "; ".join(f"{k}: {va!r} vs {vb!r}" for k, (va, vb) in differs.items())
        raise ProtocolMismatch(
            f"evaluations {a.get('evaluation_id')} and {b.get('evaluation_id')} were made under "
            f"different protocols ({fields}): their rates do not measure the same thing; "
            "compare evaluations of one protocol, or pass --force to compare anyway"
        )
    base = {**compare(a, b), "protocol_known": differs is not None, "protocol_differs": differs}
    if not a.get("run_id") or not b.get("run_id"):
        why = "an evaluation has no recorded collect run"
        return {**base, "method": "unpaired", "unpaired_because": why}
    ta = per_task(run_outcomes(wh, a["run_id"], a.get("judge")))
    tb = per_task(run_outcomes(wh, b["run_id"], b.get("judge")))
    only_a = set(ta["task_id"]) - set(tb["task_id"])
    only_b = set(tb["task_id"]) - set(ta["task_id"])
    shared = ta.height - len(only_a)
    if common_tasks and shared and (only_a or only_b):
        base["tasks_left_out"] = len(only_a) + len(only_b)
        ta = ta.filter(~pl.col("task_id").is_in(list(only_a)))
        tb = tb.filter(~pl.col("task_id").is_in(list(only_b)))
        only_a = only_b = set()
    if only_a or only_b or ta.is_empty():
        why = (
            f"the evaluations ran different tasks ({len(only_a)} only in A, {len(only_b)} only "
            "in B)"
            if ta.height
            else "A has no task"
        )
        return {**base, "method": "unpaired", "unpaired_because": why}
    both = ta.join(tb, on="task_id", suffix="_b").filter(
        pl.col("success").is_not_null() & pl.col("success_b").is_not_null()
    )
    if both.is_empty():
        return {**base, "method": "unpaired", "unpaired_because": "no task was scored in both"}
    out = {
        **base,
        **_paired(both, n_boot, seed),
        "method": "paired",
        "unpaired_tasks": ta.height - both.height,
        "newcombe_low": base["ci_low"],  # (what an unpaired comparison would have said)
        "newcombe_high": base["ci_high"],
    }
    for by in ("site", "template"):
        out[f"by_{by}"] = [
            {by: key, **_paired(group, n_boot, seed)}
            for (key,), group in sorted(both.group_by(by), key=lambda kv: str(kv[0][0]))
        ]
    return out


def _paired(both: pl.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """The paired statistics of a frame of pairs (``success``: A's, ``success_b``: B's)."""
    d = (both["success_b"] - both["success"]).to_list()
    binary = bool((both["n"] == 1).all() and (both["n_b"] == 1).all())
    a_only = int(((both["success"] == 1) & (both["success_b"] == 0)).sum())
    b_only = int(((both["success"] == 0) & (both["success_b"] == 1)).sum())
    templates = both["template"].to_list()
    lo, hi = cluster_bootstrap(d, templates, n_boot=n_boot, seed=seed)
    w_lo, w_hi = stratified_bootstrap(d, templates, n_boot=n_boot, seed=seed)
    return {
        "n_pairs": both.height,
        "clusters": both["template"].n_unique(),
        "pair_rate_a": float(both["success"].mean()),
        "pair_rate_b": float(both["success_b"].mean()),
        "diff": float(sum(d) / len(d)),
        "ci_low": lo,
        "ci_high": hi,
        "within_low": w_lo,
        "within_high": w_hi,
        "a_only": a_only,
        "b_only": b_only,
        "mcnemar_p": mcnemar_exact(a_only, b_only) if binary else None,
    }
