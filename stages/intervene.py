"""The ``intervene`` stage (InT) and the ``rationales`` stage (ERA); ``flows.intervene`` runs
them as Prefect flows.

Wiring of :mod:`curation.interventions` and :mod:`curation.rationales`: the bundled sites
(server, grading, the server-state probe) and page-state alignment (:mod:`judging.alignment`)
come from here, passed in as callables. ``intervene``: for each failed trajectory of a bundled
task with a reference, find its first error by replay in Chromium, ask the teacher for one
correction at the live page, verify it by replay (prefix + correction + the expert's
continuation, graded by the sites' checker) and store an ``interventions`` row and the replay
trajectory (policy ``intervention:<teacher>``) under the intervene run. Resumable: trajectories
this teacher already has an intervention for are skipped (teacher errors and infrastructure
failures are tried again), checked before any server or browser starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import weakref
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from curation.interventions import (
    LABELS_TEACHER,
    NO_ERROR_FOUND,
    RETRIED_OUTCOMES,
    TEACHER_ERROR,
    InterventionPolicy,
    Reference,
    first_error,
    intervention_record,
    label_intervention,
    make_teacher,
    record_path,
    reference_for,
    replay_reached,
    replay_traj_id,
    verify,
)
from curation.rationales import RationalesConfig, run_rationales_async
from judging.alignment import page_state
from judging.base import TrajectoryView, load_views
from rollouts.browser import SharedSlot
from rollouts.engine import Engine, EngineConfig, Finished, Job
from rollouts.env import BrowserEnv, EnvConfig, origin_of
from rollouts.policies import ExpertPolicy, expert_action_space
from rollouts.prompts import PromptConfig
from rollouts.writer import BatchWriter
from sites.server import SiteServer
from sites.tasks import BUNDLED_SCHEME, resolve_start_url
from stages.collect import bundled_grader
from stages.config import ConfigError, setting
from stages.config import check_config as check_fields
from stages.identity import Identity
from stages.report import markdown_table
from stages.runs import recorded_run
from stages.score_steps import bundled_probe
from warehouse import Warehouse, WarehouseError
from warehouse.ids import make_id, run_id_for, stable_hash
from warehouse.records import Intervention


@dataclass(frozen=True)
class InterveneConfig:
    """Which failed trajectories, which teacher. All but ``concurrency``, ``max_trajectories``,
    ``run_name`` and ``action_timeout_s`` name the run."""

    teacher: Literal["expert", "openai", "labels"] = setting(
        "expert",
        help="expert (bundled sites: replay), openai (any compatible model) or labels (the "
        "reference labels a label_reference rollout recorded: no browser, no replay).",
    )
    run: str | None = setting(None, help="Only failed trajectories of this run.")
    base_url: str | None = setting(None, help="openai teacher: endpoint URL.")
    model: str | None = setting(None, help="openai teacher: model name.")
    max_trajectories: int | None = setting(None, help="At most this many trajectories now.", min=1)
    concurrency: int = setting(2, help="Replays (browser contexts) at once.", min=1, max=256)
    run_name: str | None = setting(None, help="Run name (default: from the config).", flag="--name")
    action_timeout_s: float = setting(
        10.0,
        help="Seconds a replayed action waits for its element or page, when the source run did "
        "not record its own (replays wait as long as the collection they repeat did).",
        min=0.1,
        max=600.0,
        cli=False,
    )

    def identity(self) -> dict[str, Any]:
        """What names the run (the one rule of :mod:`stages.identity`)."""
        return Identity(
            excluded=("concurrency", "max_trajectories", "run_name", "action_timeout_s")
        ).of(self)

    @property
    def teacher_name(self) -> str:
        return self.teacher if self.teacher != "openai" else f"openai:{self.model}"


def replay_sample_idx(corrected: str) -> int:
    """The sample index of the replay that verifies a correction of trajectory ``corrected``:
    a function of that trajectory (its replays in one run are told apart by what they correct;
    all at sample 0, two corrections of one task looked like duplicates of one sample). The
    replay's ``meta.corrects`` names the trajectory too."""
    return int(stable_hash("replay-of", corrected)[:7], 16)


def check_config(wh: Warehouse, cfg: InterveneConfig) -> None:
    """Bad options, before any work starts (one line naming the option)."""
    check_fields(cfg)
    if cfg.teacher == "openai" and not (cfg.base_url and cfg.model):
        raise ConfigError("--teacher openai needs --base-url and --model")
    if cfg.run is not None and wh.sql("SELECT 1 FROM runs WHERE run_id = ?", [cfg.run]).is_empty():
        raise ConfigError(f"--run: no run {cfg.run!r} in the warehouse")


@dataclass(frozen=True)
class InterveneResult:
    """What an intervene run did: failed trajectories selected and skipped (with why), and of
    those it worked on: corrections verified and not, no error found against the reference,
    errors (retried by a re-run; a few examples)."""

    run_id: str
    selected: int
    skipped: list[str]
    intervened: int
    verified: int
    not_verified: int
    no_error_found: int
    errors: int
    error_examples: list[str]


def select_failed(wh: Warehouse, cfg: InterveneConfig) -> list[str]:
    """Failed trajectories (not replays) with no settled intervention by the teacher."""
    ids = wh.sql(
        "SELECT traj_id FROM trajectories t WHERE status = 'failure' "
        "AND ($run IS NULL OR run_id = $run) AND policy NOT LIKE 'intervention:%' "
        "AND NOT EXISTS (SELECT 1 FROM interventions i WHERE i.traj_id = t.traj_id "
        "AND i.proposer = $teacher AND NOT list_contains($retried, i.verified_outcome)) "
        "ORDER BY traj_id",
        {"run": cfg.run, "teacher": cfg.teacher_name, "retried": list(RETRIED_OUTCOMES)},
    )["traj_id"].to_list()
    return ids[: cfg.max_trajectories] if cfg.max_trajectories else ids


def successes_by_task(wh: Warehouse, task_ids: list[str]) -> dict[str, list[tuple[str, list]]]:
    """Successful trajectories' action texts per task (references for tasks without one)."""
    df = wh.sql(
        "SELECT t.task_id, t.traj_id, list(s.action_text ORDER BY s.step_idx) AS actions "
        "FROM trajectories t JOIN steps s USING (traj_id) WHERE t.status = 'success' "
        "AND list_contains($ids, t.task_id) GROUP BY ALL",
        {"ids": task_ids},
    )
    out: dict[str, list[tuple[str, list]]] = {}
    for task_id, traj_id, actions in df.iter_rows():
        out.setdefault(task_id, []).append((traj_id, actions))
    return out


def run_settings(wh: Warehouse, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each source run's configuration (action space, coordinates, marks, prompt)."""
    df = wh.sql(
        "SELECT run_id, config FROM runs WHERE list_contains($ids, run_id)", {"ids": run_ids}
    )
    out = {}
    for run_id, config in df.iter_rows():
        out[run_id] = json.loads(config) if isinstance(config, str) else (config or {})
    return out


@dataclass(frozen=True)
class Item:
    """One failed trajectory to intervene on, with its reference and its run's settings."""

    view: TrajectoryView
    reference: Reference
    env: EnvConfig
    action_space: str
    prompt: PromptConfig


def plan_items(
    wh: Warehouse, views: list[TrajectoryView], action_timeout_s: float = 10.0
) -> tuple[list[Item], list[str]]:
    """Items for trajectories that can be verified here; the others, with the reason. A replay
    waits for an element as long as its source run did (``action_timeout_s`` where the run did
    not record it)."""
    succ = successes_by_task(wh, sorted({v.task.task_id for v in views}))
    settings = run_settings(wh, sorted({v.record.run_id for v in views}))
    items, skipped = [], []
    for v in views:
        if not v.task.start_url.startswith(BUNDLED_SCHEME):
            skipped.append(f"{v.traj_id}: not a bundled task (no replay verification)")
            continue
        ref = reference_for(v.task, succ.get(v.task.task_id, []))
        if ref is None:
            skipped.append(f"{v.traj_id}: no reference (no solution, no successful trajectory)")
            continue
        run = settings.get(v.record.run_id, {})
        mode = run.get("prompt_mode") or "both"
        marks = bool(run.get("set_of_marks"))
        env = EnvConfig(
            coords=run.get("coords") or "pixels",
            set_of_marks=marks,
            action_timeout_s=float(run.get("action_timeout_s") or action_timeout_s),
            screenshots=mode != "a11y" or marks,  # the replay's prompts show what the run's did
        )
        prompt = PromptConfig(
            mode=mode,
            k_images=int(run.get("k_images") or 3),
            max_a11y_chars=int(run.get("a11y_chars") or 12_000),
            a11y_focus=bool(run.get("a11y_focus")),
            system=run.get("system_prompt") or "full",
        )
        items.append(Item(v, ref, env, expert_action_space(mode, marks), prompt))
    return items, skipped


def _unseen(env: EnvConfig) -> EnvConfig:
    """``env`` for replays that only locate page states (no prompt is built from them): no
    screenshots, which cost Chromium more CPU than the rest of a step."""
    return dataclasses.replace(env, screenshots=False)


def site_seed(items: list[Item]) -> int:
    seeds = {int((i.view.task.checker or {}).get("site_seed", 0)) for i in items}
    if len(seeds) > 1:
        raise WarehouseError(f"trajectories span several site seeds {sorted(seeds)}: pick --run")
    return seeds.pop() if seeds else 0


class Inflight:
    """Requests in flight per page (watched from the episode's first state on)."""

    def __init__(self) -> None:
        self.pending: weakref.WeakKeyDictionary[Any, set] = weakref.WeakKeyDictionary()

    def watch(self, page: Any) -> None:
        if page in self.pending:
            return
        pending: set = set()
        self.pending[page] = pending

        def started(request: Any) -> None:
            pending.add(request)

        def ended(request: Any) -> None:
            pending.discard(request)

        page.on("request", started)
        page.on("requestfinished", ended)
        page.on("requestfailed", ended)

    async def settled(self, page: Any, timeout_s: float = 5.0) -> None:
        """Wait until no request of ``page`` is in flight (then a moment for the DOM)."""
        self.watch(page)
        pending = self.pending[page]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)


class Verifier:
    """Replays in Chromium on the bundled sites: first errors, then teacher + verification."""

    def __init__(
        self,
        wh: Warehouse,
        cfg: InterveneConfig,
        run_id: str,
        server: SiteServer,
        browser: Any,
        client: httpx.AsyncClient,
    ) -> None:
        self.wh, self.cfg, self.run_id, self.server = wh, cfg, run_id, server
        self.slot = SharedSlot(browser)
        self.grader = bundled_grader(server, client)
        probe = bundled_probe(server, client)

        async def state(env: Any, t: Any, a11y: str | None) -> Any:
            """The page state once the page's own requests ended: a snapshot taken while an
            autocomplete's fetch is in flight would differ from run to run (so the
            observation's snapshot, ``a11y``, is not used: a fresh one is taken)."""
            await self.inflight.settled(env.page)
            return await page_state(env, t, probe, None)

        self.inflight = Inflight()
        self.state = state
        self.paths: dict[tuple, asyncio.Task] = {}

    def start(self, t: Any) -> tuple[str, list[str]]:
        url = resolve_start_url(t.start_url, self.server.urls)
        return url, [origin_of(url)]

    async def path(self, item: Item) -> list:
        t = item.view.task
        key = (t.task_id, t.version, item.reference.source, item.env)
        if key not in self.paths:  # recorded once per task, reference and environment

            async def record() -> list:
                env = BrowserEnv(self.slot, _unseen(item.env))
                try:
                    return await record_path(env, t, item.reference, self.start(t), self.state)
                finally:
                    await env.close()

            self.paths[key] = asyncio.ensure_future(record())
        return await self.paths[key]

    async def one(self, item: Item) -> tuple[Intervention, Finished | None]:
        """The intervention of one failed trajectory, and its replay (None: no error found)."""
        v, teacher_name = item.view, self.cfg.teacher_name
        path = await self.path(item)
        env = BrowserEnv(self.slot, _unseen(item.env))
        try:
            texts = [s.action_text for s in v.steps]
            reached = await replay_reached(env, v.task, texts, self.start(v.task), self.state)
        finally:
            await env.close()
        error = first_error(reached, path, answer_expected=item.reference.answer_expected)
        common = dict(traj_id=v.traj_id, teacher=teacher_name, reference=item.reference)
        if error is None:
            rec = intervention_record(
                **common, error=None, correction=None, verified=None, outcome=NO_ERROR_FOUND,
                replay_traj_id=None, run_id=self.run_id, detail={"path_len": len(path)},
            )  # fmt: skip
            return rec, None
        return await self.verify(item, error, path, common)

    async def verify(
        self, item: Item, error: Any, path: list, common: dict
    ) -> tuple[Intervention, Finished]:
        v = item.view
        teacher = make_teacher(
            self.cfg.teacher,
            action_space=item.action_space,
            coords=item.env.coords,
            base_url=self.cfg.base_url,
            model=self.cfg.model,
            prompt=item.prompt,
        )
        policy = InterventionPolicy(
            teacher, v.task, item.reference, error, v.steps, v.answer, path, self.state,
            ExpertPolicy(action_space=item.action_space, coords=item.env.coords),
            watch=self.inflight.watch,
        )  # fmt: skip
        replay_id = replay_traj_id(self.run_id, v.traj_id, teacher.name)
        url, allowed = self.start(v.task)
        job_task = dataclasses.replace(v.task, reference=list(item.reference.actions))
        group = make_id("group", self.run_id, v.traj_id)
        done: list[Finished] = []

        async def sink(f: Finished) -> None:
            done.append(f)

        budget = len(policy.prefix) + 2 * len(item.reference.actions) + 5
        engine = Engine(
            self.run_id, policy, self.grader, sink,
            config=EngineConfig(concurrency=1, max_steps=budget),
            env_config=item.env,
            env_factory=lambda: BrowserEnv(self.slot, item.env),
        )  # fmt: skip
        try:
            sample = replay_sample_idx(v.traj_id)
            await engine.run([Job(job_task, sample, replay_id, group, url, allowed)])
        finally:
            if hasattr(teacher, "aclose"):
                await teacher.aclose()
        traj = done[0].trajectory
        correction = policy.correction
        verified, why = verify(correction, error, policy.cursor_after, traj.status)
        outcome = traj.status
        if correction is not None and correction.action is None:
            outcome = TEACHER_ERROR
        detail = {
            "why": why,
            "prefix_steps": len(policy.prefix),
            # the replay's step that holds the correction (its observation and prompt)
            "replay_correction_step": len(policy.prefix),
            "cursor_after": policy.cursor_after,
            "replay_status": traj.status,
            "replay_error": traj.error,
            "criteria": (traj.meta or {}).get("criteria"),
        }
        rec = intervention_record(
            **common, error=error, correction=correction, verified=verified, outcome=outcome,
            replay_traj_id=replay_id, run_id=self.run_id, detail=detail,
        )  # fmt: skip
        replay = done[0]
        meta = {**(replay.trajectory.meta or {}), "corrects": v.traj_id}
        return rec, dataclasses.replace(
            replay, trajectory=dataclasses.replace(replay.trajectory, meta=meta)
        )


async def run_intervene_async(
    wh: Warehouse,
    cfg: InterveneConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
    *,
    server: SiteServer | None = None,
    browser: Any = None,
) -> InterveneResult:
    """Intervene on the selected failed trajectories (``progress`` gets the running counts).
    ``server`` (running bundled sites) and ``browser`` (a launched Chromium of the calling loop)
    are used when given, else started here, only when there is work."""
    check_config(wh, cfg)
    run_id = run_id_for("intervene", cfg.identity(), cfg.run_name)
    views = load_views(wh, select_failed(wh, cfg))
    if cfg.teacher == LABELS_TEACHER:
        return from_labels(wh, cfg, run_id, views, progress)
    items, skipped = plan_items(wh, views, cfg.action_timeout_s)
    summary: dict[str, Any] = {
        "run_id": run_id,
        "selected": len(views),
        "skipped": skipped,
        "intervened": 0,
        "verified": 0,
        "not_verified": 0,
        "no_error_found": 0,
        "errors": 0,
        "error_examples": [],
    }
    if not items:
        return InterveneResult(**summary)
    seed = site_seed(items)
    with recorded_run(wh, run_id, "intervene", dataclasses.asdict(cfg), cfg.run_name):
        async with AsyncExitStack() as stack:
            if server is None:
                server = SiteServer(seed=seed, mode="process").start()
                stack.callback(server.stop)
            elif server.seed != seed:
                raise WarehouseError(f"the given sites server has seed {server.seed}, need {seed}")
            if browser is None:
                from playwright.async_api import async_playwright

                from rollouts.browser import launch

                pw = await stack.enter_async_context(async_playwright())
                browser = await launch(pw)
                stack.push_async_callback(browser.close)
            client = await stack.enter_async_context(httpx.AsyncClient())
            verifier = Verifier(wh, cfg, run_id, server, browser, client)
            await _run_items(wh, verifier, items, summary, cfg.concurrency, progress)
    return InterveneResult(**summary)


def from_labels(
    wh: Warehouse,
    cfg: InterveneConfig,
    run_id: str,
    views: list[TrajectoryView],
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> InterveneResult:
    """The ``labels`` teacher: each failed trajectory's own reference labels give its first
    error and the correction there (:func:`curation.interventions.label_intervention`); one
    write, no server or browser. Trajectories without labels are skipped, with the reason."""
    summary: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS, 0)
    summary.update(run_id=run_id, selected=len(views), skipped=[], error_examples=[])
    records: list[Intervention] = []
    for v in views:
        rec = label_intervention(v.traj_id, v.meta, len(v.steps), run_id)
        if isinstance(rec, str):
            summary["skipped"].append(rec)
            continue
        records.append(rec)
        _count(summary, rec)
    if records:
        with recorded_run(wh, run_id, "intervene", dataclasses.asdict(cfg), cfg.run_name):
            wh.write(records)
    if progress:
        progress(summary)
    return InterveneResult(**summary)


async def _run_items(
    wh: Warehouse,
    verifier: Verifier,
    items: list[Item],
    summary: dict[str, Any],
    concurrency: int,
    progress: Callable[[dict[str, Any]], None] | None,
) -> None:
    sem, writing = asyncio.Semaphore(concurrency), asyncio.Lock()

    async def store(rec: Intervention, replay: Finished | None) -> None:
        """The replay trajectory, then its intervention; one writer at a time."""
        async with writing:
            if replay is not None:
                writer = BatchWriter(wh).start()
                await writer.put(replay)
                await writer.close()
            wh.write([rec])

    async def one(item: Item) -> None:
        async with sem:
            try:
                rec, replay = await verifier.one(item)
            except Exception as exc:  # one trajectory's failure never loses the others
                summary["errors"] += 1
                if len(summary["error_examples"]) < 5:
                    summary["error_examples"].append(
                        f"{item.view.traj_id}: {type(exc).__name__}: {exc}"[:300]
                    )
                return
            await store(rec, replay)
            _count(summary, rec)
            if progress:
                progress(summary)

    await asyncio.gather(*(one(i) for i in items))


def _count(summary: dict[str, Any], rec: Intervention) -> None:
    if rec.verified_outcome == NO_ERROR_FOUND:
        summary["no_error_found"] += 1
        return
    if rec.verified is None:
        summary["errors"] += 1
        if len(summary["error_examples"]) < 5:
            why = (rec.detail or {}).get("teacher_error") or (rec.detail or {}).get("why")
            summary["error_examples"].append(f"{rec.traj_id}: {why}"[:300])
        return
    summary["intervened"] += 1
    summary["verified" if rec.verified else "not_verified"] += 1


def run_intervene(
    wh: Warehouse,
    cfg: InterveneConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
    *,
    server: SiteServer | None = None,
) -> InterveneResult:
    """:func:`run_intervene_async` in its own event loop (with a browser of its own)."""
    return asyncio.run(run_intervene_async(wh, cfg, progress, server=server))


SUMMARY_FIELDS = ("selected", "intervened", "verified", "not_verified", "no_error_found", "errors")


def intervene_markdown(res: InterveneResult) -> str:
    """An intervene run's counts, skipped trajectories and error examples as markdown."""
    summary = dataclasses.asdict(res)
    counts = [{"what": k.replace("_", " "), "trajectories": summary[k]} for k in SUMMARY_FIELDS]
    counts.insert(1, {"what": "skipped", "trajectories": len(summary["skipped"])})
    lines = [f"# Interventions, run `{summary['run_id']}`", "", markdown_table(counts)]
    for title, key in (("Skipped", "skipped"), ("Error examples", "error_examples")):
        if summary[key]:
            lines += ["", f"## {title}", ""] + [f"- {x}" for x in summary[key][:20]]
    return "\n".join(lines)


# -- rationales ---------------------------------------------------------------------------------


def run_rationales(
    wh: Warehouse,
    cfg: RationalesConfig,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Teacher thoughts for the steps of successful expert trajectories (recorded as a run)."""
    run_id = run_id_for("rationales", dataclasses.asdict(cfg))
    with recorded_run(wh, run_id, "rationales", dataclasses.asdict(cfg)):
        return asyncio.run(run_rationales_async(wh, cfg, run_id, progress))
