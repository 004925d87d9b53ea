"""The ``evaluate`` stage (``flows.evaluate`` runs it as a Prefect flow): a policy (or a
checkpoint) on a split's tasks, graded, summarised with
95% Wilson intervals per site and difficulty, stored in ``evaluations``.

Graded by the rollouts' own outcome (the bundled checkers at episode end), or, with a judge
(``--judge rubric_vlm --judge-base-url … --judge-model …``; any suite, e.g. imported live-web
tasks), by that judge's verdicts: it judges the rollouts, the evaluation records it, a
trajectory it could not decide is left out (never a failure), and deltas compare evaluations of
the same judge only.

Thin: the rollouts are a collect run (resumable, so a re-run continues and then re-summarises
the same trajectories into the same evaluation id); the summary is ``training.evaluate``.
A checkpoint is run by the rollout policy its folder is for (``ranker`` or ``hf``); text-only
policies observe the accessibility tree only (no screenshots are captured: fast).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from judging.base import judge_needs
from stages import runs
from stages.collect import CollectConfig, CollectResult, run_collect
from stages.config import setting
from stages.judge import (
    JudgeConfig,
    JudgeResult,
    check_judge,
    check_judge_fits,
    judge_setting,
    judges,
    run_judge_async,
)
from stages.report import markdown_table, percent
from training.evaluate import Summary, compare_evaluations, protocol_differences, record
from training.load import POLICY_OF, model_kind, resolve_policy
from warehouse import Warehouse
from warehouse.records import Evaluation


def eval_rollout() -> CollectConfig:
    """An evaluation's rollouts by default: the ranker, greedy, on 100 ``test`` tasks of the
    bundled suite, actions waiting 3 s (local sites answer in ms)."""
    return CollectConfig(policy="ranker", split="test", n_tasks=100, action_timeout_s=3.0)


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate: a policy on a split's tasks. The rollouts are a collect config
    (``rollout``: policy, suite, split, tasks, step budget, …); ``checkpoint`` is a checkpoint
    id, training run id or folder for the ``ranker`` / ``hf`` policies, which then set the
    rollouts' model and prompt mode; the ``openai`` policy takes ``base_url`` and ``model``."""

    checkpoint: str | None = setting(None, help="Checkpoint id, training run id or folder.")
    prompt_mode: Literal["screenshot", "a11y", "both"] | None = setting(
        None, help="The policy's prompt mode (default: its own; a11y for the ranker).", cli=False
    )
    max_repeats: int = setting(
        3,
        help="End an episode at this many equal actions on one page (0 = never): a greedy "
        "policy would repeat them to the step budget.",
        min=0,
        max=1000,
    )
    judge: JudgeConfig = judge_setting(
        "Who decides the outcomes: 'none' (the rollouts' own grading: the bundled checkers), "
        "or a judge config (programmatic, rubric_vlm, ensemble) that judges them.",
        flag="--judge",
        prefix="judge-",
    )
    rollout: CollectConfig = setting(
        factory=eval_rollout,
        help="The evaluation's rollouts (a collect config; defaults: eval_rollout).",
        cli_fields=(
            "policy",
            "suite",
            "split",
            "n_tasks",
            "samples",
            "temperature",
            "choose",
            "max_steps",
            "seed",
            "base_url",
            "model",
            "allow_origins",
            "concurrency",
        ),
        flags={"n_tasks": "--n"},
    )

    @property
    def policy(self) -> str:
        return self.rollout.policy

    @property
    def suite(self) -> str:
        return self.rollout.suite

    @property
    def split(self) -> str | None:
        return self.rollout.split

    def check(self) -> None:
        """A judge that cannot decide the suite's trajectories is refused before any rollout
        (the programmatic judge needs checkers, which only the bundled suite has)."""
        if judges(self.judge):
            check_judge_fits(self.judge, self.suite, "judge", "the rollouts' own grading")


def collect_config(cfg: EvalConfig, model: str | None, prompt_mode: str) -> CollectConfig:
    """The collect run an evaluation rolls out (its id names the evaluation): ``cfg.rollout``
    with the resolved policy's model and prompt mode."""
    engine = dict(cfg.rollout.engine)
    if cfg.max_repeats:
        engine["max_repeats"] = cfg.max_repeats
    return dataclasses.replace(cfg.rollout, model=model, prompt_mode=prompt_mode, engine=engine)


@dataclass(frozen=True)
class EvalResult:
    """An evaluation: its stored row, the summary (overall, per site and difficulty, with
    Wilson intervals), the collect run that rolled it out, and (the flow adds them) the deltas
    to earlier evaluations on the same suite and split."""

    evaluation: Evaluation
    summary: Summary
    collect: CollectResult
    deltas: tuple[dict[str, Any], ...] = ()
    judged: JudgeResult | None = None  # the judge run over the rollouts (None: own grading)

    @property
    def evaluation_id(self) -> str:
        return self.evaluation.evaluation_id

    @property
    def run_id(self) -> str:
        return self.collect.run_id

    @property
    def checkpoint_id(self) -> str | None:
        return self.evaluation.checkpoint_id


async def run_evaluation(
    wh: Warehouse,
    cfg: EvalConfig,
    on_progress: Callable[[Any], None] | None = None,
    *,
    server: Any = None,
    browser: Any = None,
) -> EvalResult:
    """Roll out, grade, summarise and store the evaluation."""
    cfg.check()
    if judges(cfg.judge):
        check_judge(cfg.judge)  # a bad judge is refused before any rollout
    policy = resolve_policy(wh, cfg.policy, cfg.checkpoint, cfg.rollout.model, cfg.prompt_mode)
    coll = collect_config(cfg, policy.model, policy.prompt_mode)
    res = await run_collect(wh, coll, on_progress, server=server, browser=browser)
    jres, jcfg = None, dataclasses.replace(cfg.judge, run=res.run_id)
    if judges(cfg.judge):
        jres = await run_judge_async(wh, jcfg)
    extra = {
        "config": dataclasses.asdict(cfg),
        "flow_run_id": runs.orchestrator_run(),
        "protocol": protocol(cfg, coll, jres, jcfg),
    }
    ev, summary = record(
        wh,
        res.run_id,
        suite=cfg.suite,
        split=cfg.split,
        policy=cfg.policy,
        checkpoint_id=policy.checkpoint_id,
        extra=extra,
        judge=jres.judge if jres else None,
        judge_identity=jcfg.identity() if jres else None,
        exact_judge=bool(jres) and judge_needs(jres.judge, "checkers"),
    )
    return EvalResult(evaluation=ev, summary=summary, collect=res, judged=jres)


def protocol(cfg: EvalConfig, coll: CollectConfig, jres: Any, jcfg: Any) -> dict[str, Any]:
    """The evaluation's protocol: what decides its numbers besides the policy. Who judged
    (name, version, model, prompt templates, settings; or the rollouts' own grading), how the
    policy was prompted and read (prompt format, mode, parser version), how it acted (decoding,
    step budget, repeat rule). ``webloop eval compare`` refuses evaluations whose protocols
    differ unless forced."""
    from judging.base import SPECS
    from rollouts.actions import ACTION_GRAMMAR_VERSION
    from rollouts.prompts import PROMPT_FORMAT_VERSION, system_prompt

    judge: dict[str, Any] = {"judge": "own grading (the suite's checkers)"}
    if jres is not None:
        settings = {k: v for k, v in jcfg.identity().items() if k != "run"}
        judge = {"judge": jres.judge, "judge_version": jres.version, "judge_model": jres.model}
        judge["judge_settings"] = settings
        names = (jres.judge, *map(str, settings.get("members") or ()))
        prompts = sorted({SPECS[n].prompts for n in names if n in SPECS and SPECS[n].prompts})
        if prompts:  # (one hash as before; a list when judges with other prompts join)
            judge["judge_prompts"] = prompts[0] if len(prompts) == 1 else prompts
    system = hashlib.sha256(system_prompt(coll.system_prompt).encode()).hexdigest()[:16]
    off_default = {  # how the tree was cut and the action chosen, where not the default
        # (older protocols lack them)
        k: getattr(coll, k)
        for k in ("a11y_chars", "a11y_focus", "choose", "system_prompt")
        if getattr(coll, k) != CollectConfig.__dataclass_fields__[k].default
    }
    return {
        **judge,
        **off_default,
        "policy_prompt_format": PROMPT_FORMAT_VERSION,
        "policy_system_prompt": system,
        "prompt_mode": coll.prompt_mode,
        "action_grammar": ACTION_GRAMMAR_VERSION,
        "temperature": coll.temperature,
        "samples": coll.samples,
        "max_steps": coll.max_steps,
        "max_repeats": cfg.max_repeats,
    }


def earlier_evaluations(wh: Warehouse, ev: dict[str, Any], limit: int = 5) -> list[dict[str, Any]]:
    """The newest other evaluations on the same suite and split, decided by the same judge (or
    all by their own grading), at most ``limit``."""
    return wh.sql(
        "SELECT * FROM evaluations WHERE suite = $suite AND split = $split "
        "AND judge IS NOT DISTINCT FROM $judge AND evaluation_id <> $id "
        "ORDER BY created_at DESC, evaluation_id LIMIT $limit",
        {
            "suite": ev["suite"],
            "split": ev["split"],
            "judge": ev.get("judge"),
            "id": ev["evaluation_id"],
            "limit": limit,
        },
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


def evaluation_markdown(res: EvalResult) -> str:
    """Success with 95% Wilson intervals (overall, per site, per difficulty) and the deltas to
    earlier evaluations on the same split (Newcombe intervals), as markdown."""
    ev, s = res.evaluation, dataclasses.asdict(res.summary)
    who = str(ev.policy) + (f" checkpoint `{ev.checkpoint_id}`" if ev.checkpoint_id else "")
    overall = [{"suite/split": f"{ev.suite}/{ev.split}", **s}]
    lines = [
        f"# Evaluation `{ev.evaluation_id}`",
        "",
        f"{who}; collect run `{res.run_id}`; outcomes: "
        + (f"judge `{ev.judge}`" if ev.judge else "the rollouts' own grading")
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
        "## Deltas to earlier evaluations on this split (this − earlier, 95%)",
        "",
        "Paired where both ran the same tasks (a bootstrap over task templates, exact McNemar); "
        "Newcombe's interval of two independent samples otherwise.",
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
                    "method": delta_method(d),
                }
                for d in res.deltas
            ],
            ["earlier", "checkpoint", "earlier rate", "this rate", "delta", "95% CI", "method"],
        ),
    ]
    return "\n".join(lines)


def delta_method(d: dict[str, Any]) -> str:
    """How a delta was computed, for a table: ``paired on N tasks, McNemar p …`` or why not."""
    if d.get("method") == "paired":
        p = d.get("mcnemar_p")
        return f"paired on {d['n_pairs']} tasks" + (f", McNemar p {p:.3g}" if p is not None else "")
    return f"unpaired, Newcombe ({d.get('unpaired_because', 'no task outcomes')})"


def evaluation_deltas(wh: Warehouse, res: EvalResult) -> tuple[dict[str, Any], ...]:
    """This evaluation against the newest earlier ones on its suite and split, of the same
    protocol (:func:`protocol`; an evaluation recorded before protocols were counts as the
    same): paired where both ran the same tasks, else Newcombe's unpaired interval
    (:func:`training.evaluate.compare_evaluations`; ``method`` says which)."""
    ev = dataclasses.asdict(res.evaluation)
    return tuple(
        {
            **compare_evaluations(wh, other, ev, force=True, n_boot=2000),
            "checkpoint": other.get("checkpoint_id") or other.get("policy"),
        }
        for other in earlier_evaluations(wh, ev)
        if not protocol_differences(other, ev)
    )


def newest_checkpoint(wh: Warehouse) -> tuple[str, str]:
    """(rollout policy, checkpoint id) of the newest registered checkpoint."""
    df = wh.sql(
        "SELECT checkpoint_id, path FROM checkpoints ORDER BY created_at DESC, step DESC LIMIT 1"
    )
    if df.is_empty():
        raise LookupError("no checkpoints registered yet (train one: webloop train sft)")
    cid, path = df.row(0)
    return POLICY_OF[model_kind(path)], cid
