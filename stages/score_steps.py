"""The ``score_steps`` stage (PRO-CUA): candidates at visited states → PRM scores → advantages.

Wiring of ``judging.prm`` (``flows.score_steps`` runs it as a Prefect flow): choose states of
stored trajectories, sample K candidates per state with a policy (stored once in
``candidates``; re-runs reuse them), score them with a registered scorer, store scores and
group-relative advantages in ``step_scores``. The exact scorer gets browsers and the bundled sites
(server, inspection, checker) from here, or from the caller. Re-running skips states whose
candidates all have a score from this scorer version (checked before any server or browser
starts); scorer errors are retried. With ``workers`` or ``dask_address`` the trajectories are
sharded across Dask workers (:mod:`stages.shards`), each with its own sites server and browsers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from judging.base import load_views
from judging.prm import (
    SPECS,
    PrefixEnded,
    Proposal,
    ScoreSummary,
    State,
    candidate_rows,
    propose,
    ranking_agreement,
    reference_label,
    score_states,
    scorer_spec,
)
from rollouts.browser import SharedSlot
from rollouts.env import BrowserEnv, BrowserSlot, EnvConfig, origin_of
from rollouts.policies import make_policy
from rollouts.prompts import PromptConfig
from sites.client import fetch_state, session_of
from sites.server import SiteServer
from sites.tasks import BUNDLED_SCHEME, resolve_start_url
from stages.collect import checkpoint_policy
from stages.config import ConfigError, setting
from stages.config import check_config as check_fields
from stages.grading import criteria_grader
from stages.identity import Identity
from stages.runs import recorded_run
from stages.shards import Session
from warehouse import Warehouse, WarehouseError
from warehouse.ids import run_id_for
from warehouse.relations import with_relations


@dataclass(frozen=True)
class ScoreStepsConfig:
    """Which states, which candidate policy, which scorer."""

    scorer: str = setting(
        "exact",
        help="exact (bundled replay), reference (the labels a label_reference rollout "
        "recorded: free), vlm, or a scorer registered by a module in WEBLOOP_PLUGINS.",
    )
    k: int = setting(4, help="Candidate actions per state (at least 2).", min=2, max=64)
    run: str | None = setting(None, help="Only trajectories of this run.")
    policy: str = setting(
        "expert",
        help="Candidates from: expert (with --noise), random, openai, or samples of a "
        "checkpoint folder (--model) with ranker or hf.",
    )
    noise: float = setting(0.5, help="Expert mistake rate for candidates.", min=0.0, max=1.0)
    base_url: str | None = setting(None, help="openai candidate policy URL.")
    model: str | None = setting(
        None, help="openai: the model name; ranker / hf: the checkpoint folder."
    )
    temperature: float = setting(1.0, help="Sampling temperature.", min=0.0, max=5.0)
    prompt_mode: Literal["screenshot", "a11y", "both"] | None = setting(
        None, help="ranker / hf candidates: the policy's prompt mode (default: its own).", cli=False
    )
    candidates: Literal["sample", "top_k"] = setting(
        "sample", help="sample (K samples) or top_k (the K likeliest distinct: ranker)."
    )
    expert_candidate: bool = setting(
        False,
        help="Exact scorer: also the reference's next action at each state's aligned step, "
        "in the state's own refs, as one more candidate where the policy did not propose it "
        "(DAgger-like: the expert's action at the states the policy reached).",
    )
    scorer_base_url: str | None = setting(None, help="vlm scorer server URL.")
    scorer_model: str | None = setting(None, help="vlm scorer model.")
    every: int = setting(1, help="Score every n-th step.", min=1, max=1000)
    max_states: int | None = setting(None, help="At most this many states.", min=1)
    select: Literal["failures_first", "first", "first_error"] = setting(
        "failures_first",
        help="Which states: failures_first (--max-states keeps unsuccessful trajectories' "
        "states first, seeded shuffle), first (trajectory-id order) or first_error (only "
        "unsuccessful trajectories' states from their first error on: meta.first_error of a "
        "label_reference rollout).",
    )
    seed: int = setting(0, help="Seed of the state selection.", min=0, max=2**32 - 1)
    concurrency: int = setting(
        4, help="States (browsers) at once (per Dask worker when sharded).", min=1, max=256
    )
    action_timeout_s: float = setting(
        3.0,
        help="Exact scorer: seconds a replayed action waits (a candidate's element gone, the "
        "reference continuing after a wrong candidate); local sites are fast.",
        min=0.1,
        max=600.0,
        flag="--action-timeout",
    )
    workers: int = setting(
        0, help="Shard across a local Dask cluster of N worker processes.", min=0, max=1024
    )
    dask_address: str | None = setting(None, help="Shard across an existing Dask cluster.")

    def identity(self) -> dict[str, Any]:
        """What names the run (:data:`SCORE_IDENTITY`, the one rule of :mod:`stages.identity`)."""
        return SCORE_IDENTITY.of(self)


def _select_used(cfg: ScoreStepsConfig) -> bool:
    """Whether ``select`` changes which states are scored from what runs scored before it
    existed (every state when ``max_states`` is unset, else the first ones): first errors
    always do; another rule only under a cap, and ``first`` never."""
    return cfg.select == "first_error" or (cfg.max_states is not None and cfg.select != "first")


SCORE_IDENTITY = Identity(
    excluded=("concurrency", "workers", "dask_address", "action_timeout_s"),
    later=("prompt_mode", "candidates", "expert_candidate"),
    used={"select": _select_used},
)
"""How a score-steps run is named."""


def check_config(cfg: ScoreStepsConfig) -> None:
    """Refuse settings that cannot score anything, before any state is selected."""
    check_fields(cfg)
    if cfg.k < 2:
        raise ConfigError("--k must be at least 2 (advantages compare candidates)")
    try:
        spec = scorer_spec(cfg.scorer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if "endpoint" in spec.needs and not (cfg.scorer_base_url and cfg.scorer_model):
        raise ConfigError(f"--scorer {cfg.scorer} needs --scorer-base-url and --scorer-model")
    if cfg.expert_candidate and not spec.expert_candidate:
        offering = " or ".join(sorted(n for n, sp in SPECS.items() if sp.expert_candidate))
        raise ConfigError(
            f"--expert-candidate needs --scorer {offering} (the expert's action comes from the "
            "bundled task's reference)"
        )


def selected_trajectories(wh: Warehouse, cfg: ScoreStepsConfig) -> list[str]:
    """The finished trajectories with steps whose states are scored (all, before ``max_states``)."""
    return wh.sql(
        "SELECT traj_id FROM trajectories WHERE status IN ('success', 'failure', 'finished', "
        "'timeout') AND ($run IS NULL OR run_id = $run) AND n_steps > 0 ORDER BY traj_id",
        {"run": cfg.run},
    )["traj_id"].to_list()


def select_states(
    wh: Warehouse, cfg: ScoreStepsConfig, only: set[str] | None = None
) -> list[State]:
    """The states to score, in a stable order; ``only``: of these trajectories (a shard)."""
    ids = selected_trajectories(wh, cfg)
    states = [
        State(v, i) for v in load_views(wh, ids) for i in range(0, len(v.steps), max(1, cfg.every))
    ]
    if _needs(cfg, "labels"):  # only the states the rollout labelled can be scored
        states = [s for s in states if reference_label(s) is not None]
    if cfg.select == "first_error":
        states = [s for s in states if after_first_error(s)]
    if cfg.max_states and cfg.max_states < len(states):
        states = prioritised(states, cfg.select, cfg.seed)[: cfg.max_states]
    return [s for s in states if s.traj.traj_id in only] if only is not None else states


def after_first_error(state: State) -> bool:
    """Whether ``state`` is of an unsuccessful trajectory, at or after its first error (the
    first state where the policy did not take the reference's labelled step)."""
    first = state.traj.meta.get("first_error")
    return state.traj.status != "success" and first is not None and state.step_idx >= first


def prioritised(states: list[State], select: str, seed: int) -> list[State]:
    """``states`` in the order a ``max_states`` budget takes them. ``failures_first``: the
    states of trajectories that did not succeed (where the policy went wrong, candidates'
    scores differ most), then the successful ones; each part in a shuffle seeded by ``seed``,
    so the budget spreads over many trajectories rather than the first few by id.
    ``first``: as given (trajectory-id order, steps in order)."""
    if select == "first":
        return list(states)
    rng = random.Random(seed)
    failed = [s for s in states if s.traj.status != "success"]
    succeeded = [s for s in states if s.traj.status == "success"]
    rng.shuffle(failed)
    rng.shuffle(succeeded)
    return failed + succeeded


def candidate_policy(cfg: ScoreStepsConfig):
    if cfg.policy == "expert":
        return make_policy("expert", noise=cfg.noise)
    if cfg.policy == "openai":
        if not cfg.base_url or not cfg.model:
            raise WarehouseError("--policy openai needs --base-url and --model")
        return make_policy(
            "openai", base_url=cfg.base_url, model=cfg.model, temperature=cfg.temperature
        )
    if cfg.policy in ("ranker", "hf"):
        return _checkpoint_candidates(cfg)
    try:
        return make_policy(cfg.policy)
    except ValueError as exc:
        raise WarehouseError(str(exc)) from exc


def _checkpoint_candidates(cfg: ScoreStepsConfig):
    """A trained checkpoint (``cfg.model``, a folder) proposing on-policy candidates, as the RL
    loop's ``step_grpo`` scores them: samples at ``cfg.temperature``, or its top-k actions."""
    if cfg.candidates == "sample" and cfg.temperature <= 0:
        raise WarehouseError("sampled candidates need --temperature > 0 (or --candidates top_k)")
    mode = cfg.prompt_mode or ("a11y" if cfg.policy == "ranker" else "both")
    return checkpoint_policy(cfg.policy, cfg.model, PromptConfig(mode=mode), cfg.temperature)


def stored_candidates(wh: Warehouse, states: list[State]) -> dict[tuple[str, int], list[Proposal]]:
    ids = sorted({s.traj.traj_id for s in states})
    df = wh.sql(
        "SELECT traj_id, step_idx, cand_idx, model_output, action_text FROM candidates "
        "WHERE list_contains($ids, traj_id) ORDER BY traj_id, step_idx, cand_idx",
        {"ids": ids},
    )
    out: dict[tuple[str, int], list[Proposal]] = {}
    for tid, step, cand, text, action in df.iter_rows():
        out.setdefault((tid, step), []).append(Proposal(cand, text or "", action))
    return out


def missing_candidates(wh: Warehouse, cfg: ScoreStepsConfig, states: list[State]) -> list[State]:
    """The states with fewer than ``cfg.k`` stored candidates."""
    have = stored_candidates(wh, states)
    return [s for s in states if len(have.get((s.traj.traj_id, s.step_idx), [])) < cfg.k]


Locate = Callable[[State], Awaitable[State]]
Expert = Callable[[State], Awaitable[tuple[State, str | None]]]
EXPERT_THOUGHT = "Thought: this is the next step of the plan."


async def ensure_candidates(
    wh: Warehouse,
    cfg: ScoreStepsConfig,
    states: list[State],
    run_id: str,
    locate: Locate | None = None,
    expert: Expert | None = None,
) -> dict[tuple[str, int], list[Proposal]]:
    """K candidates per state: the stored ones, or freshly sampled and stored. ``locate`` gives
    a state its page-state-aligned reference cursor before the policy proposes from it (the
    expert proposes the reference's next action, wherever a model's actions led). ``expert``
    (``cfg.expert_candidate``): the reference's next action at the state, added as candidate
    K + 1 where the policy's K do not hold it."""
    have = stored_candidates(wh, states)
    missing = [s for s in states if len(have.get((s.traj.traj_id, s.step_idx), [])) < cfg.k]
    if missing:
        policy = candidate_policy(cfg)
        # the expert's actions first, as many replays at once as the scorer has browsers
        experts = (
            await asyncio.gather(*(_expert_at(expert, st) for st in missing))
            if expert
            else [(None, None)] * len(missing)
        )
        try:
            rows = []
            for st, (at, extra) in zip(missing, experts, strict=True):
                at = at or await _located(locate, st)
                props = await propose(policy, at, cfg.k, cfg.seed, top_k=cfg.candidates == "top_k")
                rows += candidate_rows(st, props, policy.name, run_id)
                if extra is not None and extra not in {p.action_text for p in props}:
                    props = [
                        *props,
                        Proposal(len(props), f"{EXPERT_THOUGHT}\nAction: {extra}", extra),
                    ]
                    rows += candidate_rows(st, props[-1:], "expert-reference", run_id)
                have[(st.traj.traj_id, st.step_idx)] = props
                if len(rows) >= 512:
                    wh.write(rows)
                    rows = []
            if rows:  # (the last batch may have been written as it reached 512)
                wh.write(rows)
        finally:
            if hasattr(policy, "aclose"):
                await policy.aclose()
    keep = cfg.k + 1 if cfg.expert_candidate else cfg.k
    return {k: v[:keep] for k, v in have.items()}


async def _expert_at(expert: Expert, state: State) -> tuple[State, str | None]:
    """``state`` aligned and the expert's action there; unaligned and none when its prefix
    already answered."""
    try:
        return await expert(state)
    except PrefixEnded:
        return state, None


async def _located(locate: Locate | None, state: State) -> State:
    """``state`` aligned by ``locate``; unaligned when its prefix already answered (the scorer
    reports that state as an error)."""
    if locate is None:
        return state
    try:
        return await locate(state)
    except PrefixEnded:
        return state


def done_states(wh: Warehouse, scorer: Any, states: list[State], k: int) -> set[tuple[str, int]]:
    df = wh.sql(
        "SELECT traj_id, step_idx FROM step_scores WHERE scorer = $s AND scorer_version = $v "
        "AND error IS NULL AND list_contains($ids, traj_id) GROUP BY ALL HAVING count(*) >= $k",
        {
            "s": scorer.name,
            "v": scorer.version,
            "ids": sorted({s.traj.traj_id for s in states}),
            "k": k,
        },
    )
    return set(df.iter_rows())


# The exact scorer's grade (stages.grading.criteria_grader), under the name others import.
bundled_grade = criteria_grader


def bundled_probe(server: SiteServer, client: httpx.AsyncClient):
    """The exact scorer's probe: the replayed session's server-side state, so that page-state
    alignment sees changes the page does not show (a cart, a sent mail)."""

    async def probe(env: BrowserEnv, task: Any) -> Any:
        origin = server.url(task.site or "")
        sid = session_of(await env.cookies(origin))
        return await fetch_state(client, origin, server.secret, sid) if sid else {}

    return probe


async def _score(
    wh: Warehouse,
    cfg: ScoreStepsConfig,
    states: list[State],
    run_id: str,
    progress: Callable[[ScoreSummary], None] | None,
    server: SiteServer | None = None,
    browser: Any = None,
) -> ScoreSummary:
    """Candidates for every state, then scores for the states that lack them. Servers and
    browsers start only when something is left to do."""
    spec = scorer_spec(cfg.scorer)
    async with AsyncExitStack() as stack:
        if "replay" in spec.needs:  # browsers start only when something is left to do
            seed = exact_site_seed(states)
            done = done_states(wh, spec.factory, states, cfg.k)
            todo = [s for s in states if (s.traj.traj_id, s.step_idx) not in done]
            # the expert proposes from the aligned cursor, which needs the scorer's browsers
            replays = cfg.policy == "expert" or cfg.expert_candidate
            aligning = replays and bool(missing_candidates(wh, cfg, states))
            if not todo and not aligning:
                await ensure_candidates(wh, cfg, states, run_id)
                return ScoreSummary()
            scorer = await _replay_scorer(stack, cfg, seed, server, browser)
            locate = scorer.locate if aligning and cfg.policy == "expert" else None
            expert = scorer.expert_action if aligning and cfg.expert_candidate else None
        else:
            scorer = spec.factory(**_endpoint(cfg, spec))
            if hasattr(scorer, "aclose"):
                stack.push_async_callback(scorer.aclose)
            done = done_states(wh, scorer, states, cfg.k)
            todo = [s for s in states if (s.traj.traj_id, s.step_idx) not in done]
            locate = None
            expert = scorer.expert_action if cfg.expert_candidate else None
        cands = await ensure_candidates(wh, cfg, states, run_id, locate, expert)
        if not todo:
            return ScoreSummary()
        return await score_states(
            todo,
            cands,
            scorer,
            concurrency=cfg.concurrency,
            run_id=run_id,
            write=wh.write,
            progress=progress,
        )


def exact_site_seed(states: list[State]) -> int:
    """The one site seed of the states' bundled tasks; refuses states the exact scorer cannot
    replay (not bundled, no reference) or that span several seeds."""
    tasks = [s.traj.task for s in states]
    if any(not t.start_url.startswith(BUNDLED_SCHEME) or not t.reference for t in tasks):
        raise WarehouseError(
            "the exact scorer replays bundled tasks with a reference solution only "
            "(use --run to pick a bundled run, or --scorer vlm)"
        )
    seeds = {int((t.checker or {}).get("site_seed", 0)) for t in tasks}
    if len(seeds) > 1:
        raise WarehouseError(f"states span several site seeds {sorted(seeds)}: pick one --run")
    return seeds.pop() if seeds else 0


def _needs(cfg: ScoreStepsConfig, need: str) -> bool:
    return need in scorer_spec(cfg.scorer).needs


def _endpoint(cfg: ScoreStepsConfig, spec: Any) -> dict[str, Any]:
    """The options a scorer that needs an endpoint gets (none for the others)."""
    if "endpoint" not in spec.needs:
        return {}
    if not cfg.scorer_base_url or not cfg.scorer_model:
        raise WarehouseError(f"--scorer {cfg.scorer} needs --scorer-base-url and --scorer-model")
    return {"base_url": cfg.scorer_base_url, "model": cfg.scorer_model}


async def _replay_scorer(
    stack: AsyncExitStack,
    cfg: ScoreStepsConfig,
    seed: int,
    server: SiteServer | None = None,
    browser: Any = None,
):
    """The replaying scorer (``cfg.scorer``: exact) on ``server`` (or a sites server process
    started here) with ``cfg.concurrency`` environments: contexts of ``browser``, or one
    Chromium each."""
    if server is None:
        server = SiteServer(seed=seed, mode="process").start()
        stack.callback(server.stop)
    elif server.seed != seed:
        raise WarehouseError(f"the given sites server has seed {server.seed}, the states {seed}")
    client = await stack.enter_async_context(httpx.AsyncClient())
    n = max(1, cfg.concurrency)
    # replays are graded, never shown to a model: no screenshots (most of a step's Chromium CPU)
    env_cfg = EnvConfig(action_timeout_s=cfg.action_timeout_s, screenshots=False)
    if browser is not None:
        shared = SharedSlot(browser)
        envs = [BrowserEnv(shared, env_cfg) for _ in range(n)]
    else:
        from playwright.async_api import async_playwright

        pw = await stack.enter_async_context(async_playwright())
        envs = []
        for _ in range(n):
            slot = BrowserSlot(pw)
            stack.push_async_callback(slot.close)
            envs.append(BrowserEnv(slot, env_cfg))

    def resolve(t: Any) -> tuple[str, list[str]]:
        url = resolve_start_url(t.start_url, server.urls)
        return url, [origin_of(url)]

    return scorer_spec(cfg.scorer).factory(
        envs=envs,
        resolve=resolve,
        grade=criteria_grader(server, client),
        probe=bundled_probe(server, client),
    )


@dataclass(frozen=True)
class ScoreStepsResult:
    """What a score-steps run did: states selected, states scored now, candidates (scored ok
    or with a scorer error, a few examples); ``shards`` when it ran on Dask."""

    run_id: str
    selected: int
    states: int
    candidates: int
    scored: int
    errors: int
    error_examples: list[str]
    shards: int = 0


def _result(run_id: str, selected: int, summary: ScoreSummary, shards: int = 0) -> ScoreStepsResult:
    return ScoreStepsResult(run_id, selected, **dataclasses.asdict(summary), shards=shards)


def _selected(wh: Warehouse, cfg: ScoreStepsConfig) -> tuple[str, list[State]]:
    check_config(cfg)
    states = select_states(wh, cfg)
    if not states:
        raise WarehouseError("no finished trajectories with steps to score (check --run)")
    return run_id_for("score_steps", cfg.identity()), states


async def run_score_steps_async(
    wh: Warehouse,
    cfg: ScoreStepsConfig,
    progress: Callable[[ScoreSummary], None] | None = None,
    *,
    server: SiteServer | None = None,
    browser: Any = None,
) -> ScoreStepsResult:
    """Sample candidates and score them for the selected states.

    The exact scorer uses ``server`` (running bundled sites with the states' site seed) and
    ``browser`` (a launched Playwright Chromium of the calling event loop, left open) when
    given; otherwise it starts its own, and only when some state still needs scores."""
    run_id, states = _selected(wh, cfg)
    with recorded_run(wh, run_id, "score_steps", dataclasses.asdict(cfg)):
        summary = await _score(wh, cfg, states, run_id, progress, server, browser)
    return _result(run_id, len(states), summary)


def run_score_steps(
    wh: Warehouse,
    cfg: ScoreStepsConfig,
    progress: Callable[[ScoreSummary], None] | None = None,
    *,
    server: SiteServer | None = None,
) -> ScoreStepsResult:
    """:func:`run_score_steps_async` in its own event loop (so with browsers of its own)."""
    return asyncio.run(run_score_steps_async(wh, cfg, progress, server=server))


# -- on Dask ------------------------------------------------------------------------------------


@contextmanager
def sharded_session(wh: Warehouse, cfg: ScoreStepsConfig) -> Iterator[Session]:
    """Record the run; the trajectories whose states to shard (what the exact scorer cannot
    replay is refused here, before any worker starts)."""
    run_id, states = _selected(wh, cfg)
    if _needs(cfg, "replay"):
        exact_site_seed(states)
    ids = sorted({s.traj.traj_id for s in states})
    with recorded_run(wh, run_id, "score_steps", dataclasses.asdict(cfg)):
        yield Session(run_id, ids, total=len(states))


def run_shard(
    wh: Warehouse, cfg: ScoreStepsConfig, run_id: str, traj_ids: list[str]
) -> ScoreSummary:
    """One worker's share: the states of ``traj_ids``, with its own sites server and browsers.
    Skips scored states, so a rerun after a dead worker is safe."""
    states = select_states(wh, cfg, set(traj_ids))
    return asyncio.run(_score(wh, cfg, states, run_id, None)) if states else ScoreSummary()


def merge_shards(
    cfg: ScoreStepsConfig, session: Session, parts: list[ScoreSummary], workers: int
) -> ScoreStepsResult:
    total = ScoreSummary()
    for part in parts:
        for key in ("states", "candidates", "scored", "errors"):
            setattr(total, key, getattr(total, key) + getattr(part, key))
        total.error_examples += part.error_examples[: 5 - len(total.error_examples)]
    return _result(session.run_id, session.total, total, shards=len(parts))


def scorer_agreement(
    wh: Warehouse, scorer: str, reference: str = "exact", run: str | None = None
) -> dict[str, Any]:
    """Ranking agreement of ``scorer`` with ``reference`` over states both scored."""

    def scores(name: str) -> dict[tuple[str, int], dict[int, float]]:
        df = wh.sql(
            with_relations(
                "SELECT s.traj_id, s.step_idx, s.cand_idx, s.score FROM latest_step_scores s "
                "JOIN trajectories t USING (traj_id) WHERE s.scorer = $n AND s.error IS NULL "
                "AND s.score IS NOT NULL AND ($run IS NULL OR t.run_id = $run)"
            ),
            {"n": name, "run": run},
        )
        out: dict[tuple[str, int], dict[int, float]] = {}
        for tid, step, cand, score in df.iter_rows():
            out.setdefault((tid, step), {})[cand] = score
        return out

    return ranking_agreement(scores(scorer), scores(reference))
