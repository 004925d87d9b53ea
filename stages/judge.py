"""The ``judge`` stage: judge the backlog of one judge version (recorded as a ``judge`` run).

The work is in ``judging`` (registry, backlog, bounded-concurrency runner). Re-running the same
settings judges only what is still missing, and retries stored judge errors until their attempts
are spent. On Dask (``workers`` / ``dask_address``) the backlog is sharded across workers
(:mod:`stages.shards`), each with its own judge and model-server connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from judging.base import (
    SPECS,
    Judge,
    JudgeSummary,
    backlog,
    judge_all,
    judge_needs,
    make_judge,
)
from judging.protocols import get_protocol
from stages.config import ConfigError, setting
from stages.runs import recorded_run
from stages.shards import Session
from warehouse import Warehouse
from warehouse.ids import run_id_for

OPERATIONAL = ("concurrency", "workers", "dask_address")


@dataclass(frozen=True)
class JudgeConfig:
    """Which judge, with which options, over which trajectories. The judge's own options come
    from the typed fields of its kind (``rubric_vlm``: base URL, model, k, selection;
    ``ensemble``: members, rule, threshold) and ``options`` (any other; it wins)."""

    judge: str = setting("programmatic", help="programmatic, rubric_vlm, outcome_vlm or ensemble.")
    protocol: str | None = setting(
        None,
        help="A named evaluation protocol (webloop components): it fixes the judge and its "
        "options; a model judge's still needs --base-url and --model.",
    )
    run: str | None = setting(None, help="Only trajectories of this run.")
    base_url: str | None = setting(
        None, help="Model judges: OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1."
    )
    model: str | None = setting(None, help="Model judges: the judge model.")
    k: int = setting(4, help="rubric_vlm: key screenshots at most (image cap).", min=1, max=64)
    selection: Literal["model", "heuristic"] = setting(
        "model", help="rubric_vlm: key screenshots chosen by the model or a heuristic."
    )
    members: str | None = setting(None, help="ensemble: member judges, comma-separated.")
    rule: Literal["unanimous", "majority", "threshold"] = setting(
        "majority", help="ensemble: how member verdicts combine."
    )
    threshold: float = setting(
        0.5, help="ensemble: share of successes for rule 'threshold'.", min=0.0, max=1.0
    )
    options: dict[str, Any] = setting(
        factory=dict, help="Further options of the judge (they win over the fields).", cli=False
    )
    concurrency: int = setting(8, help="Trajectories judged at once.", min=1, max=256)
    attempts: int = setting(2, help="Tries per trajectory in this run.", min=1, max=20)
    max_attempts: int = setting(
        4, help="Over all runs: errors beyond this many tries stay errors.", min=1, max=100
    )
    workers: int = setting(
        0, help="Shard the backlog across a local Dask cluster of N processes.", min=0, max=1024
    )
    dask_address: str | None = setting(None, help="Shard across an existing Dask cluster.")

    def judge_options(self) -> dict[str, Any]:
        """The options the judge is built with: its kind's typed fields when they are used (a
        base URL, or members, given), then ``options``."""
        typed = SPECS[self.judge].options if self.judge in SPECS else ()
        used = typed and getattr(self, typed[0]) is not None
        fields = {name: getattr(self, name) for name in typed} if used else {}
        return {**fields, **self.options}

    def identity(self) -> dict[str, Any]:
        """What names the run (the options as built, so a config written with the typed fields
        and one written with ``options`` name the same run, as before the fields existed; a
        named protocol joins as its hash, only when one is used)."""
        cfg = with_protocol(self)
        named = {"protocol": protocol_hash(cfg)} if cfg.protocol else {}
        return {
            "judge": cfg.judge,
            "options": cfg.judge_options(),
            "run": cfg.run,
            "attempts": cfg.attempts,
            "max_attempts": cfg.max_attempts,
            **named,
        }


def with_protocol(cfg: JudgeConfig) -> JudgeConfig:
    """``cfg`` with its named protocol's judge and options filled in (``cfg`` itself without a
    protocol). A judge, typed option or ``options`` entry that contradicts the protocol is a
    :class:`ConfigError`: the protocol would otherwise overrule it silently."""
    if cfg.protocol is None:
        return cfg
    try:
        p = get_protocol(cfg.protocol)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    defaults = JudgeConfig.__dataclass_fields__
    if cfg.judge not in (defaults["judge"].default, p.judge):
        raise ConfigError(f"--protocol {p.name} judges with {p.judge}: drop --judge {cfg.judge}")
    typed = SPECS[p.judge].options
    given = {k: getattr(cfg, k) for k in typed if getattr(cfg, k) != defaults[k].default}
    given.update(cfg.options)
    clash = sorted(k for k, v in given.items() if k in p.options and v != p.options[k])
    if clash:
        raise ConfigError(
            f"--protocol {p.name} fixes {', '.join(clash)} "
            f"({', '.join(f'{k}={p.options[k]!r}' for k in clash)}): drop them, or judge "
            "without the protocol"
        )
    return dataclasses.replace(cfg, judge=p.judge, options={**cfg.options, **p.options})


def protocol_hash(cfg: JudgeConfig) -> str | None:
    """The hash of ``cfg``'s named protocol (None without one)."""
    return get_protocol(cfg.protocol).hash if cfg.protocol else None


@dataclass(frozen=True)
class JudgeResult:
    """What a judge run did: the judge (name, version, model), its backlog, verdict counts,
    errors (with a few examples), model calls and images per trajectory, and a one-line
    summary; ``shards`` when it ran on Dask."""

    run_id: str
    judge: str
    version: str
    model: str | None
    backlog: int
    judged: int
    verdicts: dict[str, int]
    errors: int
    error_examples: list[str]
    calls_per_traj: float
    images_per_traj: float
    line: str
    shards: int = 0


OWN_GRADING = "none"
"""``JudgeConfig.judge`` of a stage that holds a judge config but lets the rollouts' own outcome
(the bundled checkers at episode end) decide: an evaluation's or RL's default."""


def own_grading() -> JudgeConfig:
    """The judge config that judges nothing (:data:`OWN_GRADING`)."""
    return JudgeConfig(judge=OWN_GRADING)


def judges(cfg: JudgeConfig) -> bool:
    """Whether ``cfg`` names a judge that decides outcomes (not :data:`OWN_GRADING`)."""
    return cfg.judge != OWN_GRADING


def judge_names(cfg: JudgeConfig) -> set[str]:
    """The judge ``cfg`` runs and, for an ensemble, its members."""
    return {cfg.judge, *((cfg.members or "").replace(" ", "").split(","))} - {""}


JUDGE_CLI_FIELDS = ("judge", "base_url", "model", "k", "selection", "members", "rule")


def judge_setting(help: str, flag: str, prefix: str, factory: Any = own_grading) -> Any:
    """A stage config's field holding a judge config (an evaluation's, RL's reward judge, the
    flywheel's): its options ``flag`` (the judge) and ``--{prefix}base-url``, ``…model``, …"""
    helps = None
    if factory is own_grading:
        helps = {
            "judge": "none (the rollouts' own grading: the bundled checkers), or the judge that "
            "decides: programmatic, rubric_vlm, outcome_vlm or ensemble."
        }
    return setting(
        factory=factory,
        help=help,
        cli_fields=JUDGE_CLI_FIELDS,
        flags={"judge": flag},
        prefix=prefix,
        helps=helps,
    )


def build_judge(cfg: JudgeConfig) -> Judge:
    """The judge ``cfg`` names (:class:`ConfigError` for a missing or bad option)."""
    cfg = with_protocol(cfg)
    options = cfg.judge_options()
    needs = SPECS[cfg.judge].needs if cfg.judge in SPECS else frozenset()
    if "endpoint" in needs and not (options.get("base_url") and options.get("model")):
        raise ConfigError(f"--judge {cfg.judge} needs --base-url and --model")
    if "members" in needs and not options.get("members"):
        raise ConfigError(f"--judge {cfg.judge} needs --members, e.g. programmatic,rubric_vlm")
    try:
        return make_judge(cfg.judge, **options)
    except (TypeError, ValueError) as exc:
        said = str(exc)
        said = said if said.startswith("judge ") else f"judge {cfg.judge!r}: {said}"
        raise ConfigError(said) from None


def judge_ids(
    wh: Warehouse,
    cfg: JudgeConfig,
    judge: Judge,
    ids: list[str],
    run_id: str,
    progress: Callable[[JudgeSummary], None] | None = None,
) -> JudgeSummary:
    """Judge ``ids`` (its own event loop); closes the judge's HTTP client."""
    return asyncio.run(judge_ids_async(wh, cfg, judge, ids, run_id, progress))


async def judge_ids_async(
    wh: Warehouse,
    cfg: JudgeConfig,
    judge: Judge,
    ids: list[str],
    run_id: str,
    progress: Callable[[JudgeSummary], None] | None = None,
) -> JudgeSummary:
    """:func:`judge_ids` on the caller's event loop."""
    try:
        return await judge_all(
            wh,
            judge,
            ids,
            concurrency=cfg.concurrency,
            attempts=cfg.attempts,
            run_id=run_id,
            progress=progress,
            protocol=protocol_hash(cfg),
        )
    finally:
        client = getattr(judge, "client", None)
        if client is not None:
            await client.aclose()


def run_judge(
    wh: Warehouse, cfg: JudgeConfig, progress: Callable[[JudgeSummary], None] | None = None
) -> JudgeResult:
    """Judge the backlog of ``cfg``'s judge (recorded as a run)."""
    return asyncio.run(run_judge_async(wh, cfg, progress))


async def run_judge_async(
    wh: Warehouse, cfg: JudgeConfig, progress: Callable[[JudgeSummary], None] | None = None
) -> JudgeResult:
    """:func:`run_judge` on the caller's event loop (an evaluation judges its rollouts)."""
    cfg = with_protocol(cfg)
    judge = build_judge(cfg)
    run_id = run_id_for("judge", cfg.identity())
    ids = backlog(wh, judge, cfg.run, cfg.max_attempts, protocol_hash(cfg))
    with recorded_run(wh, run_id, "judge", recorded(cfg)):
        summary = await judge_ids_async(wh, cfg, judge, ids, run_id, progress)
    return result_of(run_id, judge, len(ids), summary)


def recorded(cfg: JudgeConfig) -> dict[str, Any]:
    """The run's recorded config: its settings, and a named protocol's hash and definition."""
    out = dataclasses.asdict(cfg)
    if cfg.protocol:
        out["protocol_spec"] = get_protocol(cfg.protocol).describe()
    return out


def result_of(run_id: str, judge: Judge, n_backlog: int, summary: JudgeSummary) -> JudgeResult:
    per = (lambda n: n / summary.judged) if summary.judged else (lambda n: 0.0)
    return JudgeResult(
        run_id=run_id,
        judge=judge.name,
        version=judge.version,
        model=judge.model,
        backlog=n_backlog,
        judged=summary.judged,
        verdicts=dict(summary.verdicts),
        errors=summary.errors,
        error_examples=summary.error_examples,
        calls_per_traj=per(summary.calls),
        images_per_traj=per(summary.images),
        line=summary.line(),
    )


# -- on Dask ------------------------------------------------------------------------------------


@contextmanager
def sharded_session(wh: Warehouse, cfg: JudgeConfig) -> Iterator[Session]:
    """Record the run; the backlog to shard."""
    cfg = with_protocol(cfg)
    judge = build_judge(cfg)
    run_id = run_id_for("judge", cfg.identity())
    ids = backlog(wh, judge, cfg.run, cfg.max_attempts, protocol_hash(cfg))
    with recorded_run(wh, run_id, "judge", recorded(cfg)):
        yield Session(run_id, ids, total=len(ids), extra={"judge": judge})


def run_shard(wh: Warehouse, cfg: JudgeConfig, run_id: str, ids: list[str]) -> JudgeSummary:
    """One worker's share of the backlog; skips what got a verdict meanwhile (a rerun after a
    dead worker judges only the rest)."""
    cfg = with_protocol(cfg)
    judge = build_judge(cfg)
    still = set(backlog(wh, judge, cfg.run, cfg.max_attempts, protocol_hash(cfg)))
    return judge_ids(wh, cfg, judge, [i for i in ids if i in still], run_id)


def merge_shards(
    cfg: JudgeConfig, session: Session, parts: list[JudgeSummary], workers: int
) -> JudgeResult:
    total = JudgeSummary()
    for part in parts:
        total.judged += part.judged
        total.verdicts += Counter(part.verdicts)
        total.errors += part.errors
        total.calls += part.calls
        total.images += part.images
        total.seconds = max(total.seconds, part.seconds)
        total.error_examples += part.error_examples[: 5 - len(total.error_examples)]
    res = result_of(session.run_id, session.extra["judge"], session.total, total)
    return dataclasses.replace(res, shards=len(parts))


def check_judge(cfg: JudgeConfig) -> None:
    """Refuse bad judge options before any work starts."""
    build_judge(cfg)


#: Suites whose tasks carry programmatic checkers (the bundled sites'): the rollouts' own
#: grading and the programmatic judge decide outcomes only there.
CHECKED_SUITES = ("bundled",)


def check_judge_fits(cfg: JudgeConfig, suite: str, field: str, own: str) -> None:
    """Refuse a judge that cannot decide ``suite``'s trajectories, naming ``field`` (the judge's
    setting): the programmatic judge (or an ensemble with it), or no judge at all (``own``: what
    the stage would use instead, the rollouts' own grading), on a suite without checkers. A
    named protocol is refused here: protocols re-judge stored trajectories (``webloop judge
    --protocol``); a stage's own judge is set by its judge and options."""
    if cfg.protocol:
        raise ConfigError(
            f"{field}: protocol {cfg.protocol!r} is for re-judging stored trajectories "
            "(`webloop judge --protocol NAME --run RUN`); here set the judge and its options"
        )
    if suite in CHECKED_SUITES:
        return
    if not judges(cfg):
        raise ConfigError(
            f"{field}: none ({own}) decides nothing on suite {suite!r}: its tasks have no "
            "programmatic checkers; set a judge (rubric_vlm on an OpenAI-compatible endpoint)"
        )
    checked = sorted(n for n in judge_names(cfg) if judge_needs(n, "checkers"))
    if checked:
        raise ConfigError(
            f"{field}: {checked[0]} needs tasks with checkers (suites "
            f"{', '.join(CHECKED_SUITES)}), suite {suite!r} has none; use rubric_vlm (on an "
            "OpenAI-compatible endpoint)"
        )
