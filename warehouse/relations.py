"""Shared relations: the rules every query must read the same way, each written once.

Some questions come back in many queries: which task version a trajectory ran, which judgment
of a judge counts. Copies of such a rule drift apart (and then judge calibration, curation and
the dashboard disagree about the same trajectory), so each rule is one named relation here,
and queries name it as if it were a table::

    SELECT k.site, count(*) FROM trajectories t JOIN trajectory_tasks k USING (traj_id) ...

:func:`with_relations` puts the definitions of the relations a query names in front of it, as
CTEs. The SQL-file runner (:func:`warehouse.store.run_sql_file`, for ``warehouse/queries`` and
``dashboards/sql``) and curation's pinned-snapshot reads (``curation.filters.Lake``) apply it;
inline SQL calls it: ``wh.sql(with_relations(query), params)``.

They are not views in the lake, on purpose: a relation can be read at a pinned snapshot
(``at="$snap"``: every table it reads gets ``AT (VERSION => $snap)``), which a view cannot, and
the user-SQL sandbox (:mod:`warehouse.usersql`) keeps reading the lake's tables only.

The relations:

``trajectory_tasks``
    One row per trajectory whose task version is stored: ``traj_id`` and every column of the
    task version it ran (``task_id``, ``version``, ``suite``, ``site``, ``split``,
    ``difficulty``, ``instruction``, ``meta``, …). The rule: a trajectory ran the version it
    recorded (``trajectories.task_version``; the collector, the demo sample and the
    Online-Mind2Web import always record it); a row without one (a legacy row, or one written
    by a tool that does not set it) ran version 1, the first version of every task. Never "the
    latest version": a task changed after the run would change what the run is judged and
    curated against. A trajectory whose version is not stored has no row: LEFT JOIN it.

``latest_judgments``
    One row per (trajectory, judge): that judge's latest judgment, every column of
    ``judgments``. Latest: the newest ``created_at``, then the highest ``judge_version``, then
    the highest ``judgment_id`` (so ties are broken the same way everywhere). An error or an
    abstention is a judgment too: a judge whose latest judgment is an error has no verdict now
    (an older verdict no longer counts). Callers that need verdicts filter the relation
    (``verdict IN ('success', 'failure')``), never the judgments before it.

``latest_judgments_per_version``
    The same rule per (trajectory, judge, judge_version): to calibrate one version of a judge.

``latest_protocol_judgments``
    The same rule per (trajectory, named evaluation protocol, judge model), over the judgments
    made under a protocol (``protocol`` set): a protocol's verdict on a trajectory, for the
    side-by-side comparison of protocols.

``trajectory_verdicts``
    One row per trajectory that some judge decided: ``traj_id``, ``judge``, ``verdict``
    (success / failure) of the newest of its ``latest_judgments`` with a success or failure
    verdict (same order). The outcome of a ``finished`` trajectory (live web), whose status
    says nothing yet: its reward, its evaluation outcome.

``latest_tasks``
    One row per task: its latest version (the highest ``version``), every column of ``tasks``.
    What a task is *now* (listings, curation's template keys); what a trajectory ran is
    ``trajectory_tasks``.

``latest_step_scores``
    One row per (trajectory, step, candidate, scorer): that scorer's latest score of the
    candidate, every column of ``step_scores``. Latest: the newest ``created_at``, then the
    highest ``scorer_version`` (:data:`LATEST_SCORE`). As with judgments, an error is a score
    row too: a candidate whose latest scoring failed has no score now. Callers that need scores
    filter the relation (``error IS NULL AND score IS NOT NULL``), never the rows before it.

``latest_step_scores_per_version``
    The same rule per (trajectory, step, candidate, scorer, scorer_version): the scores of one
    version of a scorer.

``latest_human_labels``
    One row per trajectory with a trajectory-level label (``step_idx IS NULL``): the latest
    one, every column of ``human_labels``. Latest: the newest ``created_at``, then the highest
    ``label_id``. A label such as ``not_executable`` is a label too: callers that need an
    outcome keep ``label IN ('success', 'failure')`` after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from warehouse.connection import LAKE

Table = Callable[[str, str | None], str]
"""``table(name, alias)`` → a FROM item reading that table of the lake."""

LATEST = "created_at DESC, judge_version DESC, judgment_id DESC"
"""The order that makes a judgment the latest (the first row in it)."""
LATEST_SCORE = "created_at DESC, scorer_version DESC"
"""The order that makes a step score the latest (the first row in it)."""
LATEST_LABEL = "created_at DESC, label_id DESC"
"""The order that makes a human label the latest (the first row in it)."""


def _trajectory_tasks(table: Table) -> str:
    return (
        f"SELECT t.traj_id, k.* FROM {table('trajectories', 't')} "
        f"JOIN {table('tasks', 'k')} "
        "ON k.task_id = t.task_id AND k.version = coalesce(t.task_version, 1)"
    )


def _first(table_name: str, order: str, *partition: str, where: str = "") -> Callable[[Table], str]:
    """The first row of ``table_name`` (after ``where``) in ``order`` per ``partition``."""

    def body(table: Table) -> str:
        return (
            f"SELECT * FROM {table(table_name, None)} {where}QUALIFY row_number() OVER "
            f"(PARTITION BY {', '.join(partition)} ORDER BY {order}) = 1"
        )

    return body


def _trajectory_verdicts(table: Table) -> str:
    return (
        "SELECT traj_id, judge, verdict FROM latest_judgments "
        "WHERE error IS NULL AND verdict IN ('success', 'failure') "
        f"QUALIFY row_number() OVER (PARTITION BY traj_id ORDER BY {LATEST}, judge DESC) = 1"
    )


JUDGED_STATUS = (
    "CASE WHEN t.status IN ('infra_error', 'running') THEN t.status "
    "WHEN j.traj_id IS NULL THEN 'unjudged' "
    "WHEN j.error IS NOT NULL THEN 'judge_error' "
    "WHEN j.verdict IN ('success', 'failure') THEN j.verdict "
    "ELSE 'judge_' || coalesce(j.verdict, 'none') END"
)
"""A trajectory's outcome by one judge (``t``: the trajectory, ``j``: that judge's row of
``latest_judgments``, joined as :data:`ONE_JUDGE`): its verdict; what it could not decide is
``judge_error`` (``unjudged``, ``judge_<verdict>``), never a failure; an infrastructure error
or a running trajectory stays what it is. Judged evaluations and judge-rewarded RL read it."""

ONE_JUDGE = "LEFT JOIN (SELECT * FROM latest_judgments WHERE judge = $judge) j USING (traj_id)"


def outcome_sql(judge: str | None) -> tuple[str, str]:
    """(status expression, join) of a trajectory ``t``'s outcome, the one rule evaluations and
    RL rewards read: its own status, a ``finished`` one taking its judges' verdict
    (``trajectory_verdicts``); or, given a ``judge`` (bound as ``$judge``), that judge's verdict
    (:data:`JUDGED_STATUS`)."""
    if judge is not None:
        return JUDGED_STATUS, ONE_JUDGE
    own = (
        "CASE WHEN t.status = 'finished' AND j.verdict IS NOT NULL THEN j.verdict ELSE t.status END"
    )
    return own, "LEFT JOIN trajectory_verdicts j USING (traj_id)"


RELATIONS: dict[str, Callable[[Table], str]] = {
    "trajectory_tasks": _trajectory_tasks,
    "latest_judgments": _first("judgments", LATEST, "traj_id", "judge"),
    "latest_judgments_per_version": _first(
        "judgments", LATEST, "traj_id", "judge", "judge_version"
    ),
    "latest_protocol_judgments": _first(
        "judgments", LATEST, "traj_id", "protocol", "model", where="WHERE protocol IS NOT NULL "
    ),
    "trajectory_verdicts": _trajectory_verdicts,
    "latest_tasks": _first("tasks", "version DESC", "task_id"),
    "latest_step_scores": _first(
        "step_scores", LATEST_SCORE, "traj_id", "step_idx", "cand_idx", "scorer"
    ),
    "latest_step_scores_per_version": _first(
        "step_scores", LATEST_SCORE, "traj_id", "step_idx", "cand_idx", "scorer", "scorer_version"
    ),
    "latest_human_labels": _first(
        "human_labels", LATEST_LABEL, "traj_id", where="WHERE step_idx IS NULL "
    ),
}
"""Relation name → its SELECT over a table reader; a relation may use the ones before it."""


def _reader(at: str | None) -> Table:
    def table(name: str, alias: str | None) -> str:
        named = f" AS {alias}" if alias else ""
        snapshot = f" AT (VERSION => {at})" if at else ""
        return f"{LAKE}.{name}{named}{snapshot}"  # DuckDB wants the alias before AT

    return table


def _names(name: str, text: str) -> bool:
    return re.search(rf"\b{name}\b", text) is not None


_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_WITH = re.compile(r"WITH\s+(?:RECURSIVE\s+)?", re.I)


def with_relations(query: str, *, at: str | None = None) -> str:
    """``query`` with the definitions of the relations it names (:data:`RELATIONS`, and those
    they use) as CTEs in front; unchanged when it names none. ``at``: a snapshot id expression
    (``"$snap"``) at which every table is read; None: the current state."""
    table = _reader(at)
    bodies = {name: make(table) for name, make in RELATIONS.items()}
    needed: set[str] = set()
    todo = [n for n in RELATIONS if _names(n, query)]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [m for m in RELATIONS if m != name and _names(m, bodies[name])]
    if not needed:
        return query
    ctes = ",\n".join(f"{n} AS ({bodies[n]})" for n in RELATIONS if n in needed)
    head = _LEADING.match(query)
    start = head.end() if head else 0
    own = _WITH.match(query, start)
    if own:  # the query's own CTEs follow the relations'
        return f"{query[: own.end()]}{ctes},\n{query[own.end() :]}"
    return f"{query[:start]}WITH {ctes}\n{query[start:]}"
