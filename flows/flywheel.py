"""The ``flywheel`` flow — webloop's main job: N rounds of collect → judge → score → intervene →
curate → train → evaluate (:mod:`stages.flywheel` says what each round does). Every stage is a
Prefect task that calls one stage function; each round's results are a markdown artifact.
Resumable: killed and re-run with the same configuration, it continues where it stopped."""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.artifacts import flow_run_id
from stages import flywheel as stage
from stages.collect import CollectConfig, CollectResult
from stages.flywheel import FlywheelConfig, FlywheelResult, Lent, RoundRecord

# Lent objects are live (a server, a browser): the tasks that take them skip Prefect's input
# cache (idempotency comes from the warehouse)
prepare = task(name="prepare", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)(
    stage.prepare_warehouse
)
collect = task(name="collect", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(
    stage.collect_run
)
judge = task(name="judge", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(stage.judge_run)
score = task(name="score", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(stage.score_run)
intervene = task(name="intervene", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(
    stage.intervene_run
)
curate = task(name="curate", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(
    stage.curate_round
)
train = task(name="train", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(
    stage.train_round
)
rl = task(name="rl", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(stage.rl_round)
evaluate = task(retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)(stage.evaluate_checkpoint)


@task(cache_policy=NO_CACHE)
def publish(cfg: FlywheelConfig, r: RoundRecord) -> str:
    """The round's markdown artifact in Prefect (key ``<flywheel id>-round-<n>``)."""
    md = stage.round_markdown(cfg, r)
    create_markdown_artifact(
        key=f"{cfg.flywheel_id}-round-{r.round}",
        markdown=md,
        description=f"webloop flywheel round {r.round}",
    )
    return md


def run_round(
    home: str | None,
    cfg: FlywheelConfig,
    n: int,
    policy: str,
    before: dict[str, Any],
    lent: Lent | None,
) -> RoundRecord:
    """Round ``n``: ``policy`` is the checkpoint folder it collects with; ``before`` its
    evaluation (the baseline this round is compared with)."""
    runs: dict[str, CollectConfig] = {}
    if n == 1:
        runs["expert"] = stage.expert_config(cfg)
    runs["policy"] = stage.policy_config(cfg, n, policy)
    collected: dict[str, CollectResult] = {k: collect(home, c, lent) for k, c in runs.items()}
    judged = {k: judge(home, cfg, c.run_id) for k, c in collected.items()}
    main = collected["expert" if n == 1 else "policy"].run_id
    scored = score(home, cfg, main, lent)
    intervened = intervene(home, cfg, n, collected["policy"].run_id, lent)
    dataset = curate(home, cfg, n)
    start = stage.sft_start(cfg, n, policy)
    trained = (
        train(home, cfg, dataset["dataset_id"], start, n == 1)
        if cfg.train_sft
        else stage.no_sft(policy)
    )
    rl_res = rl(home, cfg, n, trained, dataset["dataset_id"], lent) if cfg.train_rl else None
    final = rl_res if rl_res is not None else trained
    after = evaluate(home, cfg, final.checkpoint, lent)
    label = None if cfg.policy.kind == "ranker" or n > 1 else f"the VLM {start}"
    delta = stage.round_delta(home, before, after)
    r = stage.round_record(
        n, collected, judged, scored, intervened, dataset, trained, before, after, rl_res, label,
        delta,
    )  # fmt: skip
    return dataclasses.replace(r, markdown=publish(cfg, r))


@flow(name="flywheel", log_prints=True)
def flywheel_flow(
    cfg: FlywheelConfig, home: str | None = None, lent: Lent | None = None
) -> FlywheelResult:
    """N rounds of collect → judge → score → intervene → curate → train → evaluate (see
    :mod:`stages.flywheel`); resumable. ``lent``: a sites server and a Chromium to use instead of
    starting them per stage (:class:`stages.flywheel.Lent`)."""
    cfg.check()
    where = prepare(home, cfg)
    stage.mark(home, cfg, "running", flow_run_id=flow_run_id())
    stage.warm_encoder()
    try:
        out = _rounds(home, cfg, where, lent)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
        stage.mark(home, cfg, "failed", error, flow_run_id=flow_run_id())
        raise
    stage.mark(home, cfg, "completed", flow_run_id=flow_run_id())
    return out


def _rounds(
    home: str | None, cfg: FlywheelConfig, where: dict[str, Any], lent: Lent | None
) -> FlywheelResult:
    policy = stage.start_checkpoint(home, cfg)
    before = {**evaluate(home, cfg, policy, lent), "label": "untrained"}
    baseline = before
    rounds = []
    for n in range(1, cfg.rounds + 1):
        print(f"flywheel {cfg.flywheel_id}: round {n}/{cfg.rounds}")
        r = run_round(home, cfg, n, policy, before, lent)
        rounds.append(r)
        policy, before = r.trained.checkpoint, r.after
    return FlywheelResult(
        flywheel_id=cfg.flywheel_id,
        warehouse=where,
        untrained=baseline,
        rounds=rounds,
        final=rounds[-1].after,
        overall=stage.round_delta(home, baseline, rounds[-1].after),
    )


def flywheel(
    cfg: FlywheelConfig, home: str | None = None, lent: Lent | None = None
) -> FlywheelResult:
    """Run the flywheel flow (a Prefect flow run); its result."""
    return flywheel_flow(cfg, home, lent)
