"""The ``evaluate`` stage (``flows.evaluate`` runs it as a Prefect flow): a policy (or a
checkpoint) on a split's tasks, graded, summarised with
95% Wilson intervals per site and difficulty, stored in ``evaluations``.

Thin: the rollouts are a collect run (resumable, so a re-run continues and then re-summarises
the same trajectories into the same evaluation id); the summary is ``training.evaluate``.
A checkpoint is run by the rollout policy its folder is for (``ranker`` or ``hf``); text-only
policies observe the accessibility tree only (no screenshots are captured: fast).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stages import runs
from stages.collect import CollectConfig, run_collect
from stages.config import setting
from stages.report import markdown_table, percent
from training.evaluate import compare, record
from training.load import POLICY_OF, model_kind, resolve_policy
from warehouse import Warehouse


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate: a policy on a split's tasks. ``checkpoint``: a checkpoint id,
    training run id or folder (for the ``ranker`` / ``hf`` policies); ``model``/``base_url``:
    the ``openai`` policy's endpoint."""

    policy: str = setting("ranker", help="ranker, hf, openai, expert or random.")
    checkpoint: str | None = setting(None, help="Checkpoint id, training run id or folder.")
    split: str = setting("test", help="test, ood or train.")
    n: int = setting(100, help="Tasks (episodes per sample).", min=1, max=1_000_000)
    suite: str = setting("bundled", help="Task suite.", cli=False)
    samples: int = setting(1, help="Samples per task.", min=1, max=1000, cli=False)
    temperature: float = setting(0.0, help="Sampling temperature (0 = greedy).", min=0.0, max=5.0)
    max_steps: int = setting(30, help="Step budget per episode.", min=1, max=1000)
    seed: int = setting(0, help="Task order seed.", min=0, max=2**32 - 1)
    site_seed: int = setting(0, help="Seed of the bundled sites.", min=0, cli=False)
    prompt_mode: Literal["screenshot", "a11y", "both"] | None = setting(
        None, help="The policy's prompt mode (default: its own; a11y for the ranker).", cli=False
    )
    base_url: str | None = setting(None, help="openai: the endpoint.")
    model: str | None = setting(None, help="openai: the model name.")
    action_timeout_s: float = setting(
        3.0, help="Seconds an action waits.", min=0.1, max=600.0, cli=False
    )
    concurrency: int = setting(8, help="Episodes in flight.", min=1, max=256)
    max_repeats: int = setting(
        3,
        help="End an episode at this many equal actions on one page (0 = never): a greedy "
        "policy would repeat them to the step budget.",
        min=0,
        max=1000,
    )


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
        extra={"config": dataclasses.asdict(cfg), "flow_run_id": runs.orchestrator_run()},
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


def evaluation_deltas(wh: Warehouse, res: dict[str, Any]) -> list[dict[str, Any]]:
    """This evaluation against the newest earlier ones on its suite and split (Newcombe)."""
    ev = {k: res[k] for k in ("evaluation_id", "suite", "split", "n", "n_success")}
    ev.update(success_rate=res["success_rate"], ci_low=res["ci_low"], ci_high=res["ci_high"])
    return [
        {**compare(other, ev), "checkpoint": other.get("checkpoint_id") or other.get("policy")}
        for other in earlier_evaluations(wh, ev)
    ]


def newest_checkpoint(wh: Warehouse) -> tuple[str, str]:
    """(rollout policy, checkpoint id) of the newest registered checkpoint."""
    df = wh.sql(
        "SELECT checkpoint_id, path FROM checkpoints ORDER BY created_at DESC, step DESC LIMIT 1"
    )
    if df.is_empty():
        raise LookupError("no checkpoints registered yet (train one: webloop train sft)")
    cid, path = df.row(0)
    return POLICY_OF[model_kind(path)], cid
