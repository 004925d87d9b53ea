"""Judges: the protocol, the registry, the view of a trajectory a judge sees, and the runner.

A judge turns a finished trajectory into a :class:`~warehouse.records.Verdict` (success /
failure / abstain, a score, per-criterion results, a rationale: the value the sites' checkers
return too) — or raises :class:`JudgeError` when it cannot
(unparseable model output, a model server that is down, a missing ensemble member). Errors are
stored as judgment rows with the error text and the number of attempts, never as a failure
verdict, and the backlog offers them again on the next run until ``max_attempts`` is spent.

A judgment is keyed by (trajectory, judge, version, model): re-running a judge is idempotent,
and a retry that succeeds replaces the stored error.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from warehouse.ids import make_id
from warehouse.records import Judgment, Step, Task, Trajectory, Verdict, from_frame
from warehouse.registry import Registry, check_needs, check_once, check_options, keyword_options
from warehouse.relations import with_relations
from warehouse.retry import aretrying
from warehouse.store import Warehouse

JUDGED_STATUSES = ("success", "failure", "finished", "timeout")


class JudgeError(RuntimeError):
    """The judge reached no verdict (stored as a judge error, retried later; never a failure)."""


def untrusted(text: str | None, limit: int = 4000) -> str:
    """Untrusted text (a page's or the agent's words) made safe to place inside an
    ``<untrusted>`` block of a judge or scorer prompt: it cannot close the block."""
    text = (text or "").strip()[:limit]
    return re.sub(r"<\s*(/?)\s*untrusted", r"‹\1untrusted", text, flags=re.I) or "(none)"


@dataclass
class TrajectoryView:
    """What a judge or scorer sees: the stored trajectory with its task (the version it ran:
    ``trajectory_tasks`` of :mod:`warehouse.relations`) and its steps in order, plus the other
    judges' verdicts (each judge's latest judgment, when it is a verdict). The records are the
    warehouse's own; screenshots and accessibility trees are fetched from the blob store on
    demand."""

    record: Trajectory
    task: Task
    steps: list[Step]
    wh: Warehouse | None = None
    verdicts: dict[str, str] = field(default_factory=dict)  # judge name → its current verdict
    _trees: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def traj_id(self) -> str:
        return self.record.traj_id

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def answer(self) -> str | None:
        return self.record.answer

    @property
    def meta(self) -> dict[str, Any]:
        return self.record.meta or {}

    def screenshot(self, step: Step) -> bytes | None:
        if not step.screenshot_hash or self.wh is None:
            return None
        return self.wh.blobs.get(step.screenshot_hash)

    def a11y(self, step: Step) -> str | None:
        """The step's accessibility tree, read once per view (every later state's prompt names
        the elements of the earlier steps from their trees)."""
        if not step.a11y_hash or self.wh is None:
            return None
        if step.a11y_hash not in self._trees:
            self._trees[step.a11y_hash] = self.wh.blobs.get_text(step.a11y_hash)
        return self._trees[step.a11y_hash]


class Judge(Protocol):
    """``judge(trajectory) → verdict``; ``statuses`` are the trajectory statuses it accepts."""

    name: str
    version: str
    model: str | None
    statuses: tuple[str, ...]
    needs_verdicts: bool  # reads other judges' verdicts (ensembles)

    async def judge(self, traj: TrajectoryView) -> Verdict: ...


JUDGES: Registry[Judge] = Registry("judge")

NEEDS = {
    "checkers": "tasks with programmatic checkers (the bundled suite)",
    "endpoint": "an OpenAI-compatible server (base_url and model)",
    "members": "member judges (members)",
}
"""What a judge may need, by the name its spec uses."""


@dataclass(frozen=True)
class JudgeSpec:
    """A judge as the stages see it, declared where it is registered: ``needs`` (names of
    :data:`NEEDS`, checked by the stages before any work), ``options`` (the judge configs' typed
    fields it takes, e.g. ``base_url``; the first one given means they are used), ``prompts``
    (a hash of its prompt templates, part of an evaluation's protocol; None: it prompts no
    model), ``version`` (its rule's version: bumped when its parser or rule changes; part of a
    named protocol's hash), the summary (the class docstring's first line)."""

    name: str
    factory: Callable[..., Judge]
    needs: frozenset[str] = frozenset()
    options: tuple[str, ...] = ()
    prompts: str | None = None
    version: str | None = None

    @property
    def summary(self) -> str:
        return (inspect.getdoc(self.factory) or self.name).splitlines()[0]

    @property
    def parameters(self) -> dict[str, Any]:
        """Every option the judge takes, name → default (its constructor's keyword
        parameters; ``inspect.Parameter.empty``: required)."""
        return keyword_options(self.factory)


SPECS: dict[str, JudgeSpec] = {}
"""Judge name → its spec (filled by :func:`register`)."""


def register(
    name: str,
    *,
    needs: Sequence[str] = (),
    options: Sequence[str] = (),
    prompts: str | None = None,
    version: str | None = None,
) -> Callable:
    """``@register("rubric_vlm", needs=("endpoint",), options=(...), prompts=HASH)`` on a judge
    class: registers it and its :class:`JudgeSpec`. An unknown need, or a name registered twice,
    is refused."""
    check_needs("judge", name, needs, NEEDS)

    def deco(factory: Callable[..., Judge]) -> Callable[..., Judge]:
        old = SPECS.get(name)
        check_once("judge", name, old.factory if old else None, factory)
        SPECS[name] = JudgeSpec(name, factory, frozenset(needs), tuple(options), prompts, version)
        return JUDGES.register(name)(factory)

    return deco


def judge_needs(name: str, need: str) -> bool:
    """Whether the registered judge ``name`` needs ``need`` (unknown names: no)."""
    spec = SPECS.get(name)
    return spec is not None and need in spec.needs


def make_judge(name: str, **options: Any) -> Judge:
    """A judge by registered name (``programmatic``, ``rubric_vlm``, ``outcome_vlm``,
    ``ensemble``; the package ``judging`` imports each judge module, which registers itself
    here). An option the judge does not take is a ValueError naming the ones it does."""
    if name in SPECS:
        check_options("judge", name, options, SPECS[name].parameters)
    return JUDGES.make(name, **options)


def judgment_id(traj_id: str, judge: Judge, protocol: str | None = None) -> str:
    """The judgment's key: trajectory, judge, version, model and, when judged under a named
    protocol, its hash (ids of judgments without one are as before protocols existed)."""
    extra = [judge.model] if judge.model else []
    named = [protocol] if protocol else []
    return make_id("judgment", traj_id, judge.name, judge.version, *extra, *named)


# -- reading ------------------------------------------------------------------------------------


def backlog(
    wh: Warehouse,
    judge: Judge,
    run_id: str | None = None,
    max_attempts: int = 3,
    protocol: str | None = None,
) -> list[str]:
    """Trajectories this judge version (and model) has no verdict for; errored ones whose
    attempts are not yet spent come back. Under a named protocol (its hash), a verdict made
    without it, or under another version of it, does not count: those are judged again."""
    df = wh.sql(
        "SELECT traj_id FROM trajectories t WHERE list_contains($statuses, status) "
        "AND ($run IS NULL OR run_id = $run) AND NOT EXISTS (SELECT 1 FROM judgments j "
        "WHERE j.traj_id = t.traj_id AND j.judge = $judge AND j.judge_version = $version "
        "AND j.model IS NOT DISTINCT FROM $model AND (j.error IS NULL OR j.attempts >= $max) "
        "AND ($protocol IS NULL OR j.protocol = $protocol)) ORDER BY traj_id",
        {
            "statuses": list(judge.statuses),
            "run": run_id,
            "judge": judge.name,
            "version": judge.version,
            "model": judge.model,
            "max": max_attempts,
            "protocol": protocol,
        },
    )
    return df["traj_id"].to_list()


def load_views(wh: Warehouse, traj_ids: list[str], verdicts: bool = False) -> list[TrajectoryView]:
    """Trajectory views (the task version each ran, steps in order) for ``traj_ids``; a
    trajectory whose task version is not stored has none."""
    if not traj_ids:
        return []
    trajs = from_frame(
        Trajectory,
        wh.sql("SELECT * FROM trajectories WHERE list_contains($ids, traj_id)", {"ids": traj_ids}),
    )
    tasks = wh.sql(
        with_relations("SELECT * FROM trajectory_tasks WHERE list_contains($ids, traj_id)"),
        {"ids": traj_ids},
    )
    ran = dict(zip(tasks["traj_id"], from_frame(Task, tasks), strict=True))
    steps: dict[str, list[Step]] = {}
    rows = wh.sql(
        "SELECT * FROM steps WHERE list_contains($ids, traj_id) ORDER BY traj_id, step_idx",
        {"ids": traj_ids},
    )
    for step in from_frame(Step, rows):
        steps.setdefault(step.traj_id, []).append(step)
    judged = _latest_verdicts(wh, traj_ids) if verdicts else {}
    out = []
    for traj in trajs:
        task = ran.get(traj.traj_id)
        if task is None:
            continue  # a trajectory of an unknown task cannot be judged against it
        tid = traj.traj_id
        out.append(TrajectoryView(traj, task, steps.get(tid, []), wh, judged.get(tid, {})))
    order = {t: i for i, t in enumerate(traj_ids)}
    return sorted(out, key=lambda v: order[v.traj_id])


def _latest_verdicts(wh: Warehouse, traj_ids: list[str]) -> dict[str, dict[str, str]]:
    """traj_id → judge → verdict of its latest judgment (none where that is an error)."""
    df = wh.sql(
        with_relations(
            "SELECT traj_id, judge, verdict FROM latest_judgments "
            "WHERE list_contains($ids, traj_id) AND error IS NULL AND verdict IS NOT NULL"
        ),
        {"ids": traj_ids},
    )
    out: dict[str, dict[str, str]] = {}
    for tid, judge, verdict in df.iter_rows():
        out.setdefault(tid, {})[judge] = verdict
    return out


# -- running ------------------------------------------------------------------------------------


@dataclass
class JudgeSummary:
    """What a judge run did: verdict counts, errors, model calls and images per trajectory."""

    judged: int = 0
    verdicts: Counter = field(default_factory=Counter)
    errors: int = 0
    calls: int = 0
    images: int = 0
    seconds: float = 0.0
    error_examples: list[str] = field(default_factory=list)

    def line(self) -> str:
        per = f"{self.calls / self.judged:.1f}" if self.judged else "0"
        img = f"{self.images / self.judged:.1f}" if self.judged else "0"
        rate = self.judged / self.seconds if self.seconds else 0.0
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items())) or "no verdicts"
        return (
            f"judged {self.judged}: {counts}; judge errors {self.errors}; "
            f"{per} model calls and {img} images per trajectory; {rate:.2f} trajectories/s"
        )


async def _judge_one(
    judge: Judge, view: TrajectoryView, attempts: int, prior: int
) -> tuple[Verdict | None, str | None, int]:
    """(verdict, None, attempts so far) or (None, the last error, attempts so far): any error is
    retried up to ``attempts`` tries in all, at once (the chat client already backs off)."""
    tries = 0

    async def once() -> Verdict:
        nonlocal tries
        tries += 1
        return await judge.judge(view)

    try:
        verdict = await aretrying(attempts=attempts, retry_on=Exception, base_delay=0.0)(once)
        return verdict, None, prior + tries
    except JudgeError as exc:
        error = str(exc)[:2000]
    except Exception as exc:  # a judge bug must not lose the rest of the backlog
        error = f"{type(exc).__name__}: {exc}"[:2000]
    return None, error, prior + tries


def _row(
    judge: Judge, view: TrajectoryView, result, run_id: str | None, protocol: str | None
) -> Judgment:
    verdict, error, attempts = result
    common = dict(
        judgment_id=judgment_id(view.traj_id, judge, protocol),
        traj_id=view.traj_id,
        judge=judge.name,
        judge_version=judge.version,
        model=judge.model,
        attempts=attempts,
        run_id=run_id,
        protocol=protocol,
    )
    if verdict is None:
        return Judgment(**common, error=error)
    return Judgment(
        **common,
        prompt_hash=verdict.prompt_hash,
        verdict=verdict.verdict,
        score=verdict.score,
        criteria=verdict.criteria_dicts() or None,
        rationale=verdict.rationale,
    )


def _prior_attempts(
    wh: Warehouse, judge: Judge, traj_ids: list[str], protocol: str | None
) -> dict[str, int]:
    df = wh.sql(
        "SELECT traj_id, max(attempts) FROM judgments WHERE list_contains($ids, traj_id) "
        "AND judge = $judge AND judge_version = $version AND model IS NOT DISTINCT FROM $model "
        "AND protocol IS NOT DISTINCT FROM $protocol AND error IS NOT NULL GROUP BY traj_id",
        {
            "ids": traj_ids,
            "judge": judge.name,
            "version": judge.version,
            "model": judge.model,
            "protocol": protocol,
        },
    )
    return dict(df.iter_rows())


async def judge_all(
    wh: Warehouse,
    judge: Judge,
    traj_ids: Iterable[str],
    *,
    concurrency: int = 8,
    attempts: int = 2,
    run_id: str | None = None,
    chunk: int = 256,
    progress: Callable[[JudgeSummary], None] | None = None,
    protocol: str | None = None,
) -> JudgeSummary:
    """Judge ``traj_ids`` with at most ``concurrency`` trajectories in flight; judgments are
    written after every chunk, so an interrupted run keeps what it finished. ``protocol``: the
    hash of the named protocol they are judged under, recorded on each judgment."""
    ids = list(traj_ids)
    summary, start = JudgeSummary(), time.perf_counter()
    sem = asyncio.Semaphore(max(1, concurrency))

    async def bounded(view: TrajectoryView, prior: int):
        async with sem:
            return await _judge_one(judge, view, attempts, prior)

    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        views = load_views(wh, part, verdicts=judge.needs_verdicts)
        prior = _prior_attempts(wh, judge, part, protocol)
        results = await asyncio.gather(*(bounded(v, prior.get(v.traj_id, 0)) for v in views))
        rows = [_row(judge, v, r, run_id, protocol) for v, r in zip(views, results, strict=True)]
        wh.write(rows)
        for (verdict, error, _), row in zip(results, rows, strict=True):
            summary.judged += 1
            if verdict is None:
                summary.errors += 1
                if len(summary.error_examples) < 5:
                    summary.error_examples.append(f"{row.traj_id}: {error}")
            else:
                summary.verdicts[verdict.verdict] += 1
                summary.calls += verdict.calls
                summary.images += verdict.images
        summary.seconds = time.perf_counter() - start
        if progress:
            progress(summary)
    summary.seconds = time.perf_counter() - start
    return summary
