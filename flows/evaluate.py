"""The ``evaluate`` flow: a policy (or a checkpoint) on a split's tasks, graded, summarised with
95% Wilson intervals per site and difficulty, stored in ``evaluations``.

Thin: the rollouts are a collect run (resumable, so a re-run continues and then re-summarises
the same trajectories into the same evaluation id); the summary is ``training.evaluate``.
A checkpoint is run by the rollout policy its folder is for (``ranker`` or ``hf``); text-only
policies observe the accessibility tree only (no screenshots are captured: fast).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task

from flows import prefect_env
from flows.artifacts import artifact_key, flow_run_id, publish
from stages.collect import CollectConfig, run_collect
from stages.report import markdown_table, percent
from training.evaluate import compare, record
from training.load import POLICY_OF, model_kind, resolve_policy
from warehouse import Warehouse, WarehouseConfig


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate. ``checkpoint``: a checkpoint id, training run id or folder (for the
    ``ranker`` / ``hf`` policies); ``model``/``base_url``: the ``openai`` policy's endpoint."""

    policy: str = "ranker"
    checkpoint: str | None = None
    split: str = "test"
    n: int = 100
    suite: str = "bundled"
    samples: int = 1
    temperature: float = 0.0
    max_steps: int = 30
    seed: int = 0
    site_seed: int = 0
    prompt_mode: str | None = None  # None: the policy's own (a11y for the ranker)
    base_url: str | None = None
    model: str | None = None
    action_timeout_s: float = 3.0
    concurrency: int = 8
    # an episode ends at this many equal actions on one page (EngineConfig.max_repeats): a greedy
    # policy would repeat them to the step budget; 0 = never
    max_repeats: int = 3


def collect_config(cfg: EvalConfig, model: str | None, prompt_mode: str) -> CollectConfig:
    """The collect run an evaluation rolls out (its id names the evaluation)."""
    return CollectConfig(
        suite=cfg.suite,
        split=cfg.split,
        n_tasks=cfg.n,
        samples=cfg.samples,
        policy=cfg.policy,
        base_url=cfg.base_url,
        model=model,
        max_steps=cfg.max_steps,
        action_timeout_s=cfg.action_timeout_s,
        seed=cfg.seed,
        site_seed=cfg.site_seed,
        prompt_mode=prompt_mode,
        temperature=cfg.temperature,
        concurrency=cfg.concurrency,
        engine={"max_repeats": cfg.max_repeats} if cfg.max_repeats else {},
    )


async def run_evaluation(
    wh: Warehouse,
    cfg: EvalConfig,
    on_progress: Callable[[Any], None] | None = None,
    *,
    server: Any = None,
    browser: Any = None,
) -> dict[str, Any]:
    """Roll out, grade and summarise; the stored evaluation as a dict plus the summary."""
    policy = resolve_policy(wh, cfg.policy, cfg.checkpoint, cfg.model, cfg.prompt_mode)
    coll = collect_config(cfg, policy.model, policy.prompt_mode)
    res = await run_collect(wh, coll, on_progress, server=server, browser=browser)
    ev, summary = record(
        wh,
        res.run_id,
        suite=cfg.suite,
        split=cfg.split,
        policy=cfg.policy,
        checkpoint_id=policy.checkpoint_id,
        extra={"config": dataclasses.asdict(cfg), "flow_run_id": flow_run_id()},
    )
    return {
        **dataclasses.asdict(ev),
        "summary": dataclasses.asdict(summary),
        "collect": dataclasses.asdict(res),
    }


def earlier_evaluations(wh: Warehouse, ev: dict[str, Any], limit: int = 5) -> list[dict[str, Any]]:
    """The newest other evaluations on the same suite and split (at most ``limit``)."""
    return wh.sql(
        "SELECT * FROM evaluations WHERE suite = $suite AND split = $split "
        "AND evaluation_id <> $id ORDER BY created_at DESC, evaluation_id LIMIT $limit",
        {"suite": ev["suite"], "split": ev["split"], "id": ev["evaluation_id"], "limit": limit},
    ).to_dicts()


def _interval_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [
        {
            key: r.get(key),
            "success": f"{r['n_success']}/{r['n']}",
            "rate": percent(r["rate"]),
            "95% CI": f"[{percent(r['ci_low'])}, {percent(r['ci_high'])}]",
        }
        for r in rows
    ]


def evaluation_markdown(res: dict[str, Any], deltas: list[dict[str, Any]]) -> str:
    """Success with 95% Wilson intervals (overall, per site, per difficulty) and the deltas to
    earlier evaluations on the same split (Newcombe intervals), as markdown."""
    s = res["summary"]
    who = res["policy"] + (f" checkpoint `{res['checkpoint_id']}`" if res["checkpoint_id"] else "")
    overall = [{"suite/split": f"{res['suite']}/{res['split']}", **s}]
    lines = [
        f"# Evaluation `{res['evaluation_id']}`",
        "",
        f"{who}; collect run `{res['run_id']}`"
        + (f"; left out {s['excluded']}" if s["excluded"] else ""),
        "",
        "## Success (95% Wilson intervals)",
        "",
        markdown_table(_interval_rows(overall, "suite/split")),
        "",
        markdown_table(_interval_rows(s["by_site"], "site")),
        "",
        markdown_table(_interval_rows(s["by_difficulty"], "difficulty")),
        "",
        "## Deltas to earlier evaluations on this split (this − earlier, 95% Newcombe)",
        "",
        markdown_table(
            [
                {
                    "earlier": d["a"],
                    "checkpoint": d["checkpoint"],
                    "earlier rate": percent(d["rate_a"]),
                    "this rate": percent(d["rate_b"]),
                    "delta": f"{d['diff']:+.1%}",
                    "95% CI": f"[{d['ci_low']:+.1%}, {d['ci_high']:+.1%}]",
                    "separated": d["separated"],
                }
                for d in deltas
            ],
            ["earlier", "checkpoint", "earlier rate", "this rate", "delta", "95% CI", "separated"],
        ),
    ]
    return "\n".join(lines)


def publish_evaluation(wh: Warehouse, res: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluation's markdown artifact; returns the deltas it shows."""
    ev = {k: res[k] for k in ("evaluation_id", "suite", "split", "n", "n_success")}
    ev.update(success_rate=res["success_rate"], ci_low=res["ci_low"], ci_high=res["ci_high"])
    deltas = [
        {**compare(other, ev), "checkpoint": other.get("checkpoint_id") or other.get("policy")}
        for other in earlier_evaluations(wh, ev)
    ]
    publish(
        artifact_key("evaluation", res["suite"], res["split"]),
        evaluation_markdown(res, deltas),
        f"evaluation {res['evaluation_id']} on {res['suite']}/{res['split']}",
    )
    return deltas


@task(name="evaluate-policy")
def evaluate_policy(cfg: EvalConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = asyncio.run(run_evaluation(wh, cfg, prefect_env.progress_of("evaluate")))
        res["deltas"] = publish_evaluation(wh, res)
        return res


@flow(name="evaluate")
def evaluate_flow(cfg: EvalConfig, home: str | None = None) -> dict[str, Any]:
    """Evaluate a policy on a split; the result is stored in ``evaluations``."""
    return evaluate_policy(cfg, home)


def newest_checkpoint(wh: Warehouse) -> tuple[str, str]:
    """(rollout policy, checkpoint id) of the newest registered checkpoint."""
    df = wh.sql(
        "SELECT checkpoint_id, path FROM checkpoints ORDER BY created_at DESC, step DESC LIMIT 1"
    )
    if df.is_empty():
        raise LookupError("no checkpoints registered yet (train one: webloop train sft)")
    cid, path = df.row(0)
    return POLICY_OF[model_kind(path)], cid


@task(name="find-newest-checkpoint")
def find_newest_checkpoint(home: str | None = None) -> tuple[str, str]:
    with Warehouse.open(WarehouseConfig.from_env(home=home), read_only=True) as wh:
        return newest_checkpoint(wh)


@flow(name="evaluate_newest")
def evaluate_newest_flow(
    split: str = "ood",
    n: int = 100,
    suite: str = "bundled",
    max_steps: int = 30,
    concurrency: int = 8,
    home: str | None = None,
) -> dict[str, Any]:
    """Evaluate the newest registered checkpoint on a split (the nightly schedule)."""
    policy, checkpoint = find_newest_checkpoint(home)
    cfg = EvalConfig(
        policy=policy,
        checkpoint=checkpoint,
        split=split,
        n=n,
        suite=suite,
        max_steps=max_steps,
        concurrency=concurrency,
    )
    return evaluate_policy(cfg, home)


def evaluate(
    cfg: EvalConfig, home: str | Path | None = None, on_progress: Callable | None = None
) -> dict[str, Any]:
    """Run the evaluate flow; ``on_progress`` receives engine stats about once a second."""
    with prefect_env.progress_to("evaluate", on_progress):
        return evaluate_flow(cfg, str(home) if home is not None else None)
