"""The ``flywheel`` stage — webloop's main job (``flows.flywheel`` runs it as a Prefect flow of
tasks, one per stage call here): N rounds of

    collect → judge → score (PRM on a sample) → intervene → curate → train → evaluate

on the bundled sites with the CPU-scale ``ranker`` policy (or any recipe's data), each round's
policy being the previous round's checkpoint.

* Round 1 bootstraps: the noisy scripted expert collects ``train`` tasks (with mistakes, so there
  are failures) and the untrained ranker collects G samples per task; both are judged, a sample of
  states gets exact PRM scores, the expert teacher intervenes on a few of the untrained policy's
  failures, the recipe curates the successes (filtered BC, plus verified interventions), and the
  ranker is trained by SFT from scratch.
* Round r > 1 collects with round r-1's checkpoint (sampled at ``temperature``, G per task, on
  another seeded subset of ``train`` tasks, with the step budget of the recipe's horizon
  schedule), judges, scores, intervenes, curates the successes of every round so far and
  continues SFT from round r-1's checkpoint on them (rejection-sampling fine-tuning: the policy's
  own successes join the expert's).
* Every round evaluates its checkpoint on held-out ``test`` tasks (greedy; 95% Wilson intervals)
  and compares it with the previous round (round 1: the untrained ranker) with Newcombe's
  interval. Each round's results are a Prefect markdown artifact.

Resumable: every stage is an idempotent library call keyed by deterministic ids — collect runs
are named ``<flywheel id>-r<round>-<expert|policy>``, judging and scoring skip what is stored,
interventions skip settled trajectories, a round's dataset is found again by its recipe hash (the
recipe names the round's runs), training runs are named by model, dataset and config (resumed
from their last checkpoint), evaluations by their collect run. Killed at any point and re-run with
the same configuration, the flow continues where it stopped and writes nothing twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from curation.build import build_dataset
from curation.curriculum import horizon_at
from curation.interventions import RETRIED_OUTCOMES
from curation.recipe import Recipe, load_recipe, parse_recipe, recipe_hash
from judging.base import judge_needs
from judging.prm import NEEDS, needs
from sites.tasks import generate as generate_tasks
from stages.collect import CollectConfig, CollectResult, run_collect
from stages.config import ConfigError, check_config, setting
from stages.evaluate import EvalConfig, delta_method, eval_rollout, run_evaluation
from stages.identity import Identity
from stages.intervene import InterveneConfig, run_intervene_async
from stages.judge import (
    JudgeConfig,
    check_judge,
    check_judge_fits,
    judge_names,
    judge_setting,
    judges,
    run_judge,
)
from stages.runs import code_version
from stages.score_steps import ScoreStepsConfig, run_score_steps_async
from stages.train import RLConfig, SFTConfig, TrainResult, rl_rollout, run_rl, run_sft
from training.evaluate import compare, compare_evaluations, find_evaluation
from warehouse import Warehouse, WarehouseConfig, migrations
from warehouse.ids import make_id
from warehouse.records import Run, utcnow
from warehouse.tasks import put_tasks

# The flywheel's default recipe: filtered behaviour cloning over the flywheel's own runs (the
# sources' runs are filled in per round), verified interventions as extra SFT rows, and a TTI
# horizon schedule for the policy's rollouts (round 1's untrained policy gets a short budget).
DEFAULT_RECIPE = """
name: flywheel
description: "Judged successes of the expert and of the policy so far, plus verified corrections."
sources: {splits: [train]}
filters:
  - verdict: {judges: [programmatic], verdict: success, min_agreement: 1.0}
  - drop_invalid_steps: {noop: false}
  - drop_loops: {max_repeats: 2}
  - dedup_trajectories: {}
curriculum: {weights: none, horizon: [10, 20]}
include: {interventions: true}
output: {sft: true, rl_groups: false, preferences: false, k_images: 1}
gates: {success_rate: [1.0, 1.0]}
"""


# The default recipe with the ``labels`` teacher (whose policy rollouts carry reference labels):
# the successes whole, each failure's steps before its first error, and the reference's action
# at that error (bench/curation_value.py: +19 points over all steps of a weak policy's pool).
CORRECTED_RECIPE = (
    DEFAULT_RECIPE.replace(
        "Judged successes of the expert and of the policy so far, plus verified corrections.",
        "Successes whole, failures up to their first error, and the correction there.",
    )
    .replace(
        "verdict: {judges: [programmatic], verdict: success, min_agreement: 1.0}",
        "before_first_error: {}",
    )
    .replace("success_rate: [1.0, 1.0]", "success_rate: [0.0, 1.0]")
)


class FlywheelError(ConfigError):
    """A flywheel configuration that cannot run (names the option)."""


def flywheel_expert() -> CollectConfig:
    """Round 1's expert rollouts by default: the noisy scripted expert on 24 ``train`` tasks,
    accessibility tree only (the ranker reads it; no screenshots: fast), 26 steps."""
    return CollectConfig(
        policy="expert", n_tasks=24, noise=0.12, prompt_mode="a11y", max_steps=26,
        action_timeout_s=1.5,
    )  # fmt: skip


def flywheel_rollout() -> CollectConfig:
    """Each round's policy rollouts by default: the round's ranker checkpoint, G = 2 samples at
    temperature 1 on 8 ``train`` tasks (the step budget: the recipe's horizon schedule)."""
    return CollectConfig(
        policy="ranker", n_tasks=8, samples=2, temperature=1.0, prompt_mode="a11y",
        action_timeout_s=1.5,
    )  # fmt: skip


def flywheel_eval() -> CollectConfig:
    """Each round's evaluation rollouts by default: greedy on 24 held-out ``test`` tasks."""
    return dataclasses.replace(
        eval_rollout(), split="test", n_tasks=24, max_steps=24, action_timeout_s=1.5
    )


def _judged_by(spec: Any, judge: str) -> Any:
    """A recipe filter with its ``verdict`` judges set to ``judge`` (other filters as they are)."""
    if spec.name != "verdict":
        return spec
    params = spec.params.model_copy(update={"judges": (judge,)})
    return spec.model_copy(update={"params": params})


def programmatic() -> JudgeConfig:
    """The flywheel's judge by default: the bundled sites' checkers."""
    return JudgeConfig(judge="programmatic")


def _judge_identity(cfg: JudgeConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.identity().items() if k != "run"}


ROUND_SFT = "(the round's SFT checkpoint)"
"""``FlywheelConfig.rl.policy``: each round's RL starts from that round's SFT checkpoint."""


def flywheel_rl() -> RLConfig:
    """Each round's RL stage by default (with ``train_rl``): one GRPO iteration from the round's
    SFT checkpoint, G = 4 samples on 8 ``train`` tasks, the SFT loss on the round's dataset as
    the anchor (PPO-ptx: what the batch leaves out is not forgotten)."""
    rollout = dataclasses.replace(
        rl_rollout(), n_tasks=8, samples=4, max_steps=24, action_timeout_s=1.5
    )
    return RLConfig(
        policy=ROUND_SFT, estimator="grpo", iterations=1, anchor_coef=1.0, rollout=rollout
    )


@dataclass(frozen=True)
class PolicyConfig:
    """The policy the flywheel trains: the CPU-scale ``ranker`` (a fresh one in round 1), or
    ``hf``: a Hugging Face vision-language model folder (Qwen2.5-VL / Qwen3-VL class on a GPU;
    the ``tiny-idefics`` or ``smol-idefics`` preset, built offline, on a CPU) that round 1
    fine-tunes and whose RL rollouts are served (``rl.serve``)."""

    kind: Literal["ranker", "hf"] = setting(
        "ranker", help="ranker (CPU-scale, bundled sites) or hf (a Hugging Face VLM folder)."
    )
    model: str | None = setting(
        None,
        help="hf: the start checkpoint folder (or a preset built offline: tiny-idefics, "
        "smol-idefics).",
    )
    lora_r: int | None = setting(None, help="hf: LoRA rank of SFT (none: full).", min=1, max=4096)


def flywheel_teacher() -> InterveneConfig:
    """Who corrects the policy's failures by default: the scripted expert (bundled sites)."""
    return InterveneConfig(teacher="expert")


def flywheel_prm() -> ScoreStepsConfig:
    """How sampled states are scored by default: the exact PRM (replays on the bundled sites),
    candidates from the noisy expert, every third step."""
    return ScoreStepsConfig(every=3)


#: The flywheel's settings before it held collect configs, by their old names (its id keeps them,
#: so existing flywheels resume): old name → (nested config, field).
_OLD_KEYS = {
    "expert_tasks": ("expert", "n_tasks"),
    "noise": ("expert", "noise"),
    "expert_max_steps": ("expert", "max_steps"),
    "policy_tasks": ("rollout", "n_tasks"),
    "group_size": ("rollout", "samples"),
    "temperature": ("rollout", "temperature"),
    "eval_split": ("eval", "split"),
    "eval_n": ("eval", "n_tasks"),
    "eval_max_steps": ("eval", "max_steps"),
    "action_timeout_s": ("rollout", "action_timeout_s"),
}
#: Set by the flywheel (per round and stage), or operational: not part of its id.
_SET_BY_FLYWHEEL = {"seed", "run_name", "concurrency", "model", "workers", "dask_address"}
_SET_BY_FLYWHEEL |= {"lease_wait_s", "task_ids"}
_SET_BY_FLYWHEEL_ROLLOUT = {"max_steps", "policy"}  # the horizon schedule; policy.kind
#: Score-steps settings the flywheel sets (its prm_states / prm_k, the round's run, seeds).
_PRM_SET = {"run", "k", "max_states", "seed"}


@dataclass(frozen=True)
class FlywheelConfig:
    """The whole loop: its rounds, the stages' configs and the training schedule. The expert's,
    the policy's and the evaluation's rollouts are collect configs (``expert``, ``rollout``,
    ``eval``); the flywheel sets their seeds (``seed``; the policy's ``seed + round``), run names,
    the policy's checkpoint and step budget (the recipe's horizon schedule) and ``concurrency``.
    Everything but ``concurrency`` names the flywheel (its id prefixes every run it makes), so the
    same configuration resumes the same flywheel."""

    rounds: int = setting(2, help="Rounds of the loop.", min=1, max=1000)
    seed: int = setting(0, help="Seed of tasks, rollouts and training.", min=0, max=2**32 - 1)
    bundled_tasks: int = setting(
        200, help="Bundled tasks to generate (train/test/ood).", min=1, max=1_000_000
    )
    prm_states: int = setting(
        4, help="States of the round's main run scored by the exact PRM (0: skip).", min=0
    )
    prm_k: int = setting(3, help="PRM candidates per state.", min=2, max=64)
    interventions: int = setting(
        2, help="Failures the expert teacher corrects per round (0: skip).", min=0
    )
    recipe: str | None = setting(
        None, help="Curation recipe file (default: the flywheel's own, DEFAULT_RECIPE)."
    )
    epochs: int = setting(6, help="Round 1's SFT epochs.", min=1, max=10_000)
    later_epochs: int = setting(
        3,
        help="SFT epochs of later rounds (continuing from the previous checkpoint).",
        min=1,
        max=10_000,
    )
    lr: float = setting(2e-3, help="SFT learning rate.", min=1e-12, max=10.0, cli=False)
    batch_size: int = setting(16, help="SFT batch size.", min=1, max=100_000, cli=False)
    concurrency: int = setting(4, help="Trajectories in flight.", min=1, max=256)
    expert: CollectConfig = setting(
        factory=flywheel_expert,
        help="Round 1's expert rollouts (a collect config; defaults: flywheel_expert).",
        cli_fields=("n_tasks", "noise"),
        flags={"n_tasks": "--expert-tasks", "noise": "--noise"},
    )
    rollout: CollectConfig = setting(
        factory=flywheel_rollout,
        help="Each round's policy rollouts (a collect config; defaults: flywheel_rollout).",
        cli_fields=("n_tasks", "samples", "temperature"),
        flags={"n_tasks": "--policy-tasks", "samples": "--group-size"},
    )
    train_sft: bool = setting(
        True,
        help="Each round's SFT on its curated dataset (off: the round's policy goes to RL, or "
        "is evaluated, as it is).",
    )
    train_rl: bool = setting(
        False,
        help="After each round's SFT, on-policy RL from its checkpoint (the rl config); the "
        "round's policy is then RL's checkpoint.",
    )
    rl: RLConfig = setting(
        factory=flywheel_rl,
        help="Each round's RL stage with train_rl (an RL config; its policy and anchor dataset "
        "are the round's; defaults: flywheel_rl).",
        cli_fields=("estimator", "iterations", "lr", "kl_coef", "anchor_coef"),
        prefix="rl-",
    )
    judge: JudgeConfig = judge_setting(
        "The judge of every round's rollouts, whose successes the default recipe keeps (a "
        "judge config; the default: the bundled checkers, programmatic).",
        flag="--judge",
        prefix="judge-",
        factory=programmatic,
    )
    eval_judge: JudgeConfig = judge_setting(
        "Who decides the evaluations' outcomes: 'none' (the rollouts' own grading: the "
        "bundled checkers) or a judge config.",
        flag="--eval-judge",
        prefix="eval-judge-",
    )
    eval: CollectConfig = setting(
        factory=flywheel_eval,
        help="Each round's evaluation rollouts (a collect config; defaults: flywheel_eval).",
        cli_fields=("n_tasks", "max_steps"),
        flags={"n_tasks": "--eval-n", "max_steps": "--eval-max-steps"},
    )
    policy: PolicyConfig = setting(
        factory=PolicyConfig,
        help="The policy trained (ranker, or hf: your VLM folder); it rolls out every round.",
        cli_fields=("kind", "model", "lora_r"),
        prefix="policy-",
    )
    teacher: InterveneConfig = setting(
        factory=flywheel_teacher,
        help="Who corrects `interventions` failures a round (an intervene config: expert on the "
        "bundled sites, or openai: any OpenAI-compatible model).",
        cli_fields=("teacher", "base_url", "model"),
        flags={"teacher": "--teacher"},
        prefix="teacher-",
    )
    prm: ScoreStepsConfig = setting(
        factory=flywheel_prm,
        help="How `prm_states` states a round are scored (a score-steps config: exact on the "
        "bundled sites, or vlm: a judge model scoring candidates).",
        cli_fields=("scorer", "scorer_base_url", "scorer_model", "policy"),
        flags={"scorer": "--prm-scorer", "policy": "--prm-candidates-from"},
        prefix="prm-",
    )

    def identity(self) -> dict[str, Any]:
        """What names the flywheel: its own fields, the nested settings it had before it held
        collect configs under their old names (earlier flywheels resume), then any other nested
        setting changed from the flywheel's defaults (``rollout.k_images``, …)."""
        d = FLYWHEEL_IDENTITY.of(self)
        d.update({old: getattr(getattr(self, c), f) for old, (c, f) in _OLD_KEYS.items()})
        known = {(c, f) for c, f in _OLD_KEYS.values()}
        # one action timeout for every stage was one setting (action_timeout_s, the rollout's now)
        timeout = {"action_timeout_s": self.rollout.action_timeout_s}
        defaults = {
            "expert": dataclasses.replace(flywheel_expert(), **timeout),
            "rollout": flywheel_rollout(),
            "eval": dataclasses.replace(flywheel_eval(), **timeout),
        }
        for name, default in defaults.items():
            skip = _SET_BY_FLYWHEEL | (_SET_BY_FLYWHEEL_ROLLOUT if name == "rollout" else set())
            for f in dataclasses.fields(default):
                value = getattr(getattr(self, name), f.name)
                if (name, f.name) in known or f.name in skip or value == getattr(default, f.name):
                    continue
                d[f"{name}.{f.name}"] = value
        if self.recipe is not None:  # the recipe's content names it, not its path
            d["recipe"] = recipe_hash(self.load_recipe())
        return d

    @property
    def flywheel_id(self) -> str:
        return make_id("flywheel", self.identity())

    def load_recipe(self) -> Recipe:
        """The configured recipe, or the default one: with the ``labels`` teacher and the
        checkers as the judge, the first-error-corrected one (:data:`CORRECTED_RECIPE`: its
        step filter reads the checkers' outcomes), else the one keeping the successes of
        ``judge`` (:data:`DEFAULT_RECIPE`)."""
        if self.recipe is not None:
            return load_recipe(Path(self.recipe))
        if self.teacher.teacher == "labels" and judge_needs(self.judge.judge, "checkers"):
            return parse_recipe(CORRECTED_RECIPE, "stages/flywheel.py:CORRECTED_RECIPE")
        recipe = parse_recipe(DEFAULT_RECIPE, "stages/flywheel.py:DEFAULT_RECIPE")
        filters = tuple(_judged_by(f, self.judge.judge) for f in recipe.filters)
        return recipe.model_copy(update={"filters": filters})

    def horizon(self, round_: int) -> int:
        """The policy's step budget in round ``round_`` (1-based): the recipe's horizon
        schedule (the last entry repeats), else the evaluation's step budget."""
        return horizon_at(self.load_recipe().curriculum.horizon, round_ - 1, self.eval.max_steps)

    def check(self) -> None:
        """Bad values and stages that cannot work here, before any work (one message naming
        the setting)."""
        try:
            check_config(self)
        except ConfigError as exc:
            raise FlywheelError(str(exc)) from None
        _check_policy(self)
        if not (self.train_sft or self.train_rl):
            raise FlywheelError("train_sft: with train_rl off too, no round would train anything")
        try:
            _check_suites(self)
        except FlywheelError:
            raise
        except ConfigError as exc:
            raise FlywheelError(str(exc)) from None
        check_judge(self.judge)
        if judges(self.eval_judge):
            check_judge(self.eval_judge)
        if self.train_rl:
            try:
                rl_config(self, 1, "-", "-").check()
            except ValueError as exc:
                raise FlywheelError(f"rl.{exc}") from None
        if self.recipe is not None and not Path(self.recipe).is_file():
            raise FlywheelError(f"--recipe {self.recipe}: no such file")
        recipe = self.load_recipe()  # a RecipeError names the line
        _check_recipe_judges(self, recipe)


def _check_policy(cfg: FlywheelConfig) -> None:
    """The policy's rollouts are the policy's; a VLM needs a folder and screenshots."""
    kind = cfg.policy.kind
    if cfg.expert.policy not in ("expert", "openai"):
        raise FlywheelError(
            f"expert.policy: {cfg.expert.policy!r}; round 1's teacher data comes from the "
            "scripted expert or an OpenAI-compatible model (openai, with base_url and model)"
        )
    for name in ("rollout", "eval"):
        got = getattr(cfg, name).policy
        if got not in ("ranker", kind):  # (ranker: the default, replaced by policy.kind)
            raise FlywheelError(
                f"{name}.policy: {got!r}; this flywheel rolls out the policy it trains "
                f"(policy.kind: {kind!r}; set policy.kind: hf to train a VLM)"
            )
    if kind == "ranker":
        if cfg.policy.model is not None or cfg.policy.lora_r is not None:
            raise FlywheelError("policy.model: the ranker starts fresh; set policy.kind: hf")
        return
    if not cfg.policy.model:
        raise FlywheelError("policy.model: policy.kind hf needs a checkpoint folder")
    for name in ("expert", "rollout", "eval"):
        if getattr(cfg, name).prompt_mode == "a11y":
            raise FlywheelError(
                f"{name}.prompt_mode: 'a11y' records no screenshots; a VLM policy (policy.kind "
                "hf) trains on and reads them: use both or screenshot"
            )


def _check_recipe_judges(cfg: FlywheelConfig, recipe: Recipe) -> None:
    """A recipe filter naming a judge the flywheel does not run would find no verdicts on the
    flywheel's runs (curation would refuse it after the round's collection): refused now."""
    mine = judge_names(cfg.judge)
    for i, spec in enumerate(recipe.filters):
        for kind, _sub, name in spec.params.warehouse_names():
            if kind == "judge" and name not in mine:
                raise FlywheelError(
                    f"recipe: filters[{i}].{spec.name} names judge {name!r}, but the flywheel "
                    f"judges its runs with {cfg.judge.judge!r} (judge): name that one"
                )


def _check_suites(cfg: FlywheelConfig) -> None:
    """Stages that need the bundled sites (their checkers, reference solutions, the scripted
    expert) are refused on other suites, naming the setting."""
    suites = {n: getattr(cfg, n).suite for n in ("expert", "rollout", "eval")}
    for name, suite in suites.items():
        if suite == "bundled":
            continue
        if name == "expert" and cfg.expert.policy == "expert":
            raise FlywheelError(
                f"expert.policy: the scripted expert plays the bundled sites only, not suite "
                f"{suite!r}: use an OpenAI-compatible teacher model (openai)"
            )
        if name == "eval":
            check_judge_fits(cfg.eval_judge, suite, "eval_judge", "the rollouts' own grading")
        else:
            check_judge_fits(cfg.judge, suite, "judge", "the rollouts' own grading")
    main = suites["expert"]
    if cfg.prm_states and main != "bundled":
        if needs(cfg.prm.scorer, "bundled"):
            raise FlywheelError(
                f"prm.scorer: {cfg.prm.scorer} needs {NEEDS['bundled']}, suite {main!r} has "
                "none: use vlm, or prm_states: 0"
            )
        if cfg.prm.policy == "expert":
            raise FlywheelError(
                f"prm.policy: expert candidates need the bundled sites, not suite {main!r}: use "
                "openai (prm base_url/model), or prm_states: 0"
            )
    if cfg.interventions and cfg.teacher.teacher == "expert" and suites["rollout"] != "bundled":
        raise FlywheelError(
            f"teacher.teacher: the expert teacher corrects bundled tasks only, not suite "
            f"{suites['rollout']!r}: use openai (teacher base_url/model), or interventions: 0"
        )
    if cfg.interventions and cfg.teacher.teacher == "labels":
        if suites["rollout"] != "bundled":
            raise FlywheelError(
                f"teacher.teacher: the labels teacher reads the bundled reference's labels, "
                f"suite {suites['rollout']!r} has none: use openai, or interventions: 0"
            )
        if not _labelled(cfg.rollout):
            raise FlywheelError(
                "teacher.teacher: the labels teacher needs the policy's rollouts to record "
                "reference labels: set rollout.engine.label_reference: true"
            )
    if cfg.teacher.teacher == "openai" and not (cfg.teacher.base_url and cfg.teacher.model):
        raise FlywheelError("teacher.base_url: the openai teacher needs base_url and model")
    if needs(cfg.prm.scorer, "endpoint") and cfg.prm_states and not cfg.prm.scorer_base_url:
        raise FlywheelError(f"prm.scorer_base_url: the {cfg.prm.scorer} scorer needs an endpoint")
    if needs(cfg.prm.scorer, "labels") and cfg.prm_states:
        unlabelled = [k for k in ("expert", "rollout") if not _labelled(getattr(cfg, k))]
        if unlabelled:  # round 1 scores the expert's run, later rounds the policy's
            raise FlywheelError(
                f"prm.scorer: {cfg.prm.scorer} scores the labels a rollout records, and the scored "
                f"runs of {' and '.join(unlabelled)} record none: set "
                f"{' and '.join(f'{k}.engine.label_reference: true' for k in unlabelled)}, or "
                "use the exact scorer"
            )


def _labelled(collect: Any) -> bool:
    """Whether a collect config's rollouts record the reference's labels."""
    return bool(collect.engine.get("label_reference"))


class Lent:
    """A running bundled-sites server (site seed 0) and a launched Playwright Chromium that the
    caller owns and lends to the flywheel (they stay running after it). ``run(coro)`` runs a
    coroutine on the browser's event loop and returns its result.

    Opaque to Prefect on purpose (``__slots__``, no pickling): as a flow parameter it is stored as
    a placeholder, never serialized, and the tasks that take it skip Prefect's input-hash cache
    (idempotency comes from the warehouse)."""

    __slots__ = ("browser", "run", "server")

    def __init__(self, server: Any, browser: Any, run: Callable[[Coroutine], Any]) -> None:
        self.server, self.browser, self.run = server, browser, run

    def __reduce__(self) -> Any:
        raise TypeError("a Lent server and browser are live objects of this process")


def _run(lent: Lent | None, coro_fn: Callable[..., Coroutine]) -> Any:
    """``coro_fn(server=…, browser=…)`` on the lent server and browser (on the browser's loop), or
    ``coro_fn()`` in a fresh event loop (it starts what it needs, only when it has work)."""
    if lent is None:
        return asyncio.run(coro_fn())
    return lent.run(coro_fn(server=lent.server, browser=lent.browser))


def _open(home: str | None) -> Warehouse:
    return Warehouse.open(WarehouseConfig.from_env(home=home))


# -- names ----------------------------------------------------------------------------------------


def run_name(cfg: FlywheelConfig, round_: int, what: str) -> str:
    """The deterministic name (= id) of a collect or intervene run of the flywheel."""
    return f"{cfg.flywheel_id}-r{round_}-{what}"


def round_recipe(cfg: FlywheelConfig, round_: int) -> Recipe:
    """The recipe of round ``round_``'s dataset: the configured recipe over the collect runs of
    rounds 1..round_ (every policy among them), named after the flywheel and round."""
    base = cfg.load_recipe()
    runs = [run_name(cfg, 1, "expert")]
    runs += [run_name(cfg, r, "policy") for r in range(1, round_ + 1)]
    sources = base.sources.model_copy(update={"runs": tuple(runs), "policies": ()})
    return base.model_copy(update={"name": f"{cfg.flywheel_id}-r{round_}", "sources": sources})


# -- stages (library calls; every one idempotent) -------------------------------------------------


FLYWHEEL_IDENTITY = Identity(
    # the collect configs join below, under their old names; train_rl by rl's presence
    excluded=("expert", "rollout", "eval", "concurrency", "train_rl"),
    later=("judge", "eval_judge", "train_sft", "policy", "teacher", "prm", "rl"),
    used={"rl": lambda c: c.train_rl, "eval_judge": lambda c: judges(c.eval_judge)},
    written={
        "rl": lambda c: c.rl.identity(),
        "judge": lambda c: _judge_identity(c.judge),
        "eval_judge": lambda c: _judge_identity(c.eval_judge),
        "teacher": lambda c: c.teacher.identity(),
        "prm": lambda c: {k: v for k, v in c.prm.identity().items() if k not in _PRM_SET},
    },
)
"""How a flywheel is named, besides its collect configs' settings (its ``identity``)."""


def prepare_warehouse(home: str | None, cfg: FlywheelConfig) -> dict[str, Any]:
    """Create or upgrade the warehouse and generate the bundled suite into it."""
    wcfg = WarehouseConfig.from_env(home=home)
    tasks = generate_tasks(cfg.bundled_tasks, cfg.seed)
    with Warehouse.open(wcfg) as wh:
        rep = put_tasks(wh, tasks)
        version = migrations.current_version(wh.con)
    by_split: dict[str, int] = {}
    for t in tasks:
        by_split[t.split or "?"] = by_split.get(t.split or "?", 0) + 1
    return {
        "catalog": wcfg.describe(),
        "home": str(wcfg.home),
        "schema_version": version,
        "tasks": {"generated": len(tasks), "new": len(rep.new), **by_split},
    }


def untrained_checkpoint(home: str | None, seed: int) -> str:
    """The untrained ranker's folder (written once, atomically: a kill leaves no half folder)."""
    from training.ranker import RankerTrainable

    path = WarehouseConfig.from_env(home=home).home / "checkpoints" / f"untrained-ranker-{seed}"
    if not (path / "config.json").exists():
        tmp = path.with_name(path.name + ".tmp")
        RankerTrainable.new(seed=seed).save(tmp)
        tmp.rename(path)
    return str(path)


def start_checkpoint(home: str | None, cfg: FlywheelConfig) -> str:
    """Round 1's policy folder: the untrained ranker, or the VLM folder ``policy.model``."""
    if cfg.policy.kind == "ranker":
        return untrained_checkpoint(home, cfg.seed)
    from serving.supervisor import ServerError, resolve_model

    try:
        # a preset: built offline in this warehouse's home (its path names runs)
        return resolve_model(str(cfg.policy.model), WarehouseConfig.from_env(home=home).home)
    except ServerError as exc:
        raise FlywheelError(f"policy.model: {exc}") from None


def sft_start(cfg: FlywheelConfig, round_: int, policy: str) -> str:
    """What round ``round_``'s SFT starts from: a fresh ranker in round 1 (``ranker``), else
    ``policy`` (the VLM folder in round 1, the previous round's checkpoint after)."""
    return "ranker" if round_ == 1 and cfg.policy.kind == "ranker" else policy


def expert_config(cfg: FlywheelConfig) -> CollectConfig:
    """Round 1's expert run: ``cfg.expert`` with the flywheel's seed and run name."""
    return dataclasses.replace(
        cfg.expert, seed=cfg.seed, concurrency=cfg.concurrency, run_name=run_name(cfg, 1, "expert")
    )


def policy_config(cfg: FlywheelConfig, round_: int, checkpoint: str) -> CollectConfig:
    """Round ``round_``'s policy run: ``cfg.rollout`` by ``checkpoint``, with the recipe's step
    budget for the round and another seeded subset of train tasks each round."""
    return dataclasses.replace(
        cfg.rollout,
        policy=cfg.policy.kind,
        model=checkpoint,
        max_steps=cfg.horizon(round_),
        seed=cfg.seed + round_,
        concurrency=cfg.concurrency,
        run_name=run_name(cfg, round_, "policy"),
    )


def collect_run(home: str | None, ccfg: CollectConfig, lent: Lent | None = None) -> CollectResult:
    """Collect (or resume) a run in real Chromium, graded as trajectories end."""
    with _open(home) as wh:
        return _run(lent, lambda **kw: run_collect(wh, ccfg, **kw))


def judge_run(home: str | None, cfg: FlywheelConfig, run_id: str) -> dict[str, Any]:
    """The flywheel's judge (``cfg.judge``) over the run's backlog."""
    with _open(home) as wh:
        return dataclasses.asdict(run_judge(wh, dataclasses.replace(cfg.judge, run=run_id)))


def score_run(
    home: str | None, cfg: FlywheelConfig, run_id: str, lent: Lent | None = None
) -> dict[str, Any] | None:
    """Exact PRM scores of K candidates at a sample of the run's states (scored states kept)."""
    if not cfg.prm_states:
        return None
    prm = dataclasses.replace(
        cfg.prm,
        run=run_id,
        k=cfg.prm_k,
        max_states=cfg.prm_states,
        seed=cfg.seed,
        concurrency=cfg.concurrency,
        action_timeout_s=cfg.rollout.action_timeout_s,
    )
    with _open(home) as wh:
        if wh.sql(
            "SELECT count(*) FROM trajectories WHERE run_id = ? AND n_steps > 0", [run_id]
        ).item():
            res = _run(lent, lambda **kw: run_score_steps_async(wh, prm, **kw))
            return dataclasses.asdict(res)
    return None


def intervene_run(
    home: str | None, cfg: FlywheelConfig, round_: int, run_id: str, lent: Lent | None = None
) -> dict[str, Any] | None:
    """The teacher (``cfg.teacher``) corrects the first error of the run's first
    ``cfg.interventions`` failed trajectories (by id). Those already settled count: a re-run does
    only what is left, never the next failures."""
    if not cfg.interventions:
        return None
    with _open(home) as wh:
        settled = wh.sql(
            "SELECT count(DISTINCT i.traj_id) FROM interventions i JOIN trajectories t "
            "USING (traj_id) WHERE t.run_id = ? AND i.proposer = ? "
            "AND NOT list_contains(?, i.verified_outcome)",
            [run_id, cfg.teacher.teacher_name, list(RETRIED_OUTCOMES)],
        ).item()
        left = cfg.interventions - settled
        if left <= 0:
            return {"selected": 0, "settled": settled, "verified": 0, "not_verified": 0}
        icfg = dataclasses.replace(
            cfg.teacher,
            run=run_id,
            max_trajectories=left,
            concurrency=min(2, cfg.concurrency),
            run_name=run_name(cfg, round_, "intervene"),
            action_timeout_s=cfg.rollout.action_timeout_s,
        )
        res = _run(lent, lambda **kw: run_intervene_async(wh, icfg, **kw))
    return {**dataclasses.asdict(res), "settled": settled}


def curate_round(home: str | None, cfg: FlywheelConfig, round_: int) -> dict[str, Any]:
    """The round's dataset: found again by its recipe hash when a (killed) earlier run of the
    flywheel built it, else built now over the latest data snapshot."""
    recipe = round_recipe(cfg, round_)
    with _open(home) as wh:
        found = wh.sql(
            "SELECT dataset_id FROM datasets WHERE recipe_hash = ? ORDER BY created_at LIMIT 1",
            [recipe_hash(recipe)],
        )
        if not found.is_empty():
            return {**_dataset(wh, found.item()), "built": False}
        out = wh.cfg.home / "datasets"
        ds = build_dataset(
            wh, recipe, out_dir=out, blobs=wh.blobs, progress=None, code_version=code_version()
        )
        return {**_dataset(wh, ds.dataset_id), "built": True}


def _dataset(wh: Warehouse, dataset_id: str) -> dict[str, Any]:
    row = wh.sql(
        "SELECT dataset_id, name, snapshot_id, counts, export_path FROM datasets "
        "WHERE dataset_id = ?",
        [dataset_id],
    ).row(0, named=True)
    counts = row["counts"]
    row["counts"] = json.loads(counts) if isinstance(counts, str) else dict(counts)
    return row


def train_round(
    home: str | None, cfg: FlywheelConfig, dataset_id: str, start: str, first: bool | None = None
) -> TrainResult:
    """SFT of the policy on the round's dataset, from ``start`` (``ranker``: a fresh one, else a
    checkpoint folder: the VLM's in round 1, the previous round's after); ``first``: round 1
    (``epochs``, else ``later_epochs``; default: a fresh ranker is round 1). Resumes from the
    run's last checkpoint."""
    first = start == "ranker" if first is None else first
    scfg = SFTConfig(
        dataset=dataset_id,
        model=start,
        lora_r=cfg.policy.lora_r,
        epochs=cfg.epochs if first else cfg.later_epochs,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        save_every=50,
    )
    with _open(home) as wh:
        return run_sft(wh, scfg)


def no_sft(policy: str) -> TrainResult:
    """A round without SFT (``train_sft`` off): its "SFT checkpoint" is the policy it started
    with (a fresh ranker has none to start from: it is refused)."""
    return TrainResult(training_run_id=None, checkpoint_id=None, checkpoint=policy)


def rl_round(
    home: str | None,
    cfg: FlywheelConfig,
    round_: int,
    sft: TrainResult,
    dataset_id: str,
    lent: Lent | None = None,
) -> TrainResult:
    """Round ``round_``'s RL (``cfg.rl``) from its SFT checkpoint, anchored by its dataset, on
    another seeded subset of train tasks; resumes by its run id. Without an update (no batch had
    a learning signal) the result is the SFT checkpoint."""
    rcfg = rl_config(cfg, round_, str(sft.checkpoint), dataset_id)
    with _open(home) as wh:
        return _run(lent, lambda **kw: run_rl(wh, rcfg, None, **kw))


def rl_config(cfg: FlywheelConfig, round_: int, checkpoint: str, dataset_id: str) -> RLConfig:
    """``cfg.rl`` for round ``round_``: from ``checkpoint``, anchored by ``dataset_id``."""
    rollout = dataclasses.replace(
        cfg.rl.rollout, seed=cfg.seed + 1000 + round_, concurrency=cfg.concurrency
    )
    anchor = dataset_id if cfg.rl.anchor_coef else None
    return dataclasses.replace(cfg.rl, policy=checkpoint, anchor_dataset=anchor, rollout=rollout)


def eval_config(cfg: FlywheelConfig, checkpoint: str) -> EvalConfig:
    """A round's evaluation of ``checkpoint``: ``cfg.eval``'s rollouts, ``cfg.eval_judge``."""
    rollout = dataclasses.replace(
        cfg.eval, policy=cfg.policy.kind, seed=cfg.seed, concurrency=cfg.concurrency
    )
    return EvalConfig(checkpoint=checkpoint, rollout=rollout, judge=cfg.eval_judge)


def evaluate_checkpoint(
    home: str | None, cfg: FlywheelConfig, checkpoint: str, lent: Lent | None = None
) -> dict[str, Any]:
    """The checkpoint, greedy, on held-out tasks: success with a 95% Wilson interval."""
    ecfg = eval_config(cfg, checkpoint)
    with _open(home) as wh:
        res = _run(lent, lambda **kw: run_evaluation(wh, ecfg, **kw))
    s = res.summary
    return {
        "evaluation_id": res.evaluation_id,
        "run_id": res.run_id,
        "checkpoint_id": res.checkpoint_id,
        "n": s.n,
        "n_success": s.n_success,
        "rate": s.rate,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "ran": res.collect.ran,
    }


def round_delta(home: str | None, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """After − before: paired on the tasks both evaluations ran (the flywheel evaluates every
    round on the same seeded held-out tasks), else Newcombe's unpaired interval; ``method``
    says which (:func:`training.evaluate.compare_evaluations`)."""
    if not before.get("evaluation_id") or not after.get("evaluation_id"):
        return compare(before, after)
    with _open(home) as wh:
        a, b = (find_evaluation(wh, e["evaluation_id"]) for e in (before, after))
        return compare_evaluations(wh, a, b, force=True, n_boot=2000)


# -- reporting ------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def eval_line(e: dict[str, Any]) -> str:
    return (
        f"{e['n_success']}/{e['n']} = {_pct(e['rate'])} [{_pct(e['ci_low'])}, {_pct(e['ci_high'])}]"
    )


def round_markdown(cfg: FlywheelConfig, r: RoundRecord) -> str:
    """One round's results as a markdown table (the Prefect artifact's body)."""
    n, b, a, d = r.round, r.before, r.after, r.delta
    collected = "; ".join(
        f"{k}: {v.ran + v.skipped} trajectories {v.by_status or '(stored)'}"
        for k, v in r.collected.items()
    )
    ds = r.dataset
    rows = [
        f"# Flywheel {cfg.flywheel_id}, round {n}/{cfg.rounds}",
        "",
        "| | |",
        "|---|---|",
        f"| collected | {collected} |",
        f"| judged now | {sum(j['judged'] for j in r.judged.values())} |",
        f"| PRM states scored | {(r.scored or {}).get('selected', 0)} |",
        f"| interventions | {_iv_line(r.intervened)} |",
        f"| dataset | `{ds['name']}` {ds['dataset_id']}: "
        + ", ".join(f"{k} {v}" for k, v in ds["counts"].items())
        + " |",
        f"| checkpoint | {r.trained.checkpoint_id} (from {r.start}) |",
        *([f"| RL | {_rl_line(r.rl)} |"] if r.rl else []),
        f"| success before ({b['label']}) | {eval_line(b)} |",
        f"| success after (round {n}) | {eval_line(a)} |",
        f"| difference | {100 * d['diff']:+.1f} points "
        f"[{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}], " + delta_method(d) + " |",
    ]
    return "\n".join(rows)


def _rl_line(rl: RLRecord) -> str:
    its = "; ".join(
        f"iteration {i['iteration']}: mean reward {i['mean_reward']:.2f}, "
        f"{i['nonzero_advantage']}/{i['turns']} turns with a signal" + _timing(i.get("timing"))
        for i in rl.iterations
    )
    if rl.training_run_id is None:
        return f"no update (no batch had a learning signal): {its}"
    return f"{rl.training_run_id} → {rl.checkpoint_id}: {its}"


def _timing(t: dict[str, float] | None) -> str:
    """`` (rollout 3.6 s, judge 0.3 s, update 1.4 s, sync 0.1 s)`` of an RL iteration."""
    keys = [("rollout", "rollout_s"), ("judge", "judge_s"), ("update", "update_s")]
    keys += [("server start", "start_s"), ("sync", "sync_s")]
    parts = [f"{name} {t[k]:.1f} s" for name, k in keys if t and k in t]
    return f" ({', '.join(parts)})" if parts else ""


def _iv_line(iv: dict[str, Any] | None) -> str:
    if not iv:
        return "none"
    return (
        f"{iv['settled']} done before, {iv['selected']} now: {iv['verified']} verified, "
        f"{iv['not_verified']} not"
    )


def warm_encoder() -> None:
    """Load the ranker's MiniLM encoder once, in this thread, before any rollout: the ranker
    policy ranks in worker threads, and their first, concurrent ``load_model`` calls race in
    transformers' lazy imports (``cannot import name 'AutoModel'``: infra errors)."""
    from rollouts.encoder import load_model

    load_model()


def flywheel_status(cfg: FlywheelConfig, home: str | None = None) -> str | None:
    """The flywheel's ``runs`` status: None (never started), ``running`` (running, or killed),
    ``failed`` or ``completed``."""
    with _open(home) as wh:
        df = wh.sql("SELECT status FROM runs WHERE run_id = ?", [cfg.flywheel_id])
    return None if df.is_empty() else df.item()


def mark(
    home: str | None,
    cfg: FlywheelConfig,
    status: str,
    error: str | None = None,
    flow_run_id: str | None = None,
) -> None:
    """The flywheel's own ``runs`` row (kind ``flywheel``; its first start time is kept)."""
    config = {**dataclasses.asdict(cfg), "prefect_flow_run_id": flow_run_id}
    ended = utcnow() if status != "running" else None
    row = Run(cfg.flywheel_id, "flywheel", config, code_version=code_version(), status=status)
    with _open(home) as wh:
        wh.write([dataclasses.replace(row, error=error, ended_at=ended)])


@dataclass(frozen=True)
class TrainedRef:
    """A training run and the checkpoint it made (folder path and registry id)."""

    training_run_id: str | None
    checkpoint_id: str | None
    checkpoint: str | None

    @classmethod
    def of(cls, res: TrainResult) -> TrainedRef:
        return cls(res.training_run_id, res.checkpoint_id, res.checkpoint)


@dataclass(frozen=True)
class RLRecord:
    """A round's RL: its run and checkpoint (None: no batch had a learning signal, no update)
    and each iteration's figures (``RLIteration`` as dicts)."""

    training_run_id: str | None
    checkpoint_id: str | None
    iterations: list[dict[str, Any]]


@dataclass(frozen=True)
class RoundRecord:
    """What one round of the flywheel did, from its stages' results: the collect runs, what
    was judged, scored and corrected, the dataset, the SFT (and RL) training, the held-out
    evaluations before and after and their difference (``before``, ``after``: evaluation
    summaries; ``delta``: :func:`round_delta`), and its markdown artifact."""

    round: int
    collected: dict[str, CollectResult]
    judged: dict[str, Any]
    scored: dict[str, Any] | None
    intervened: dict[str, Any] | None
    dataset: dict[str, Any]
    start: str
    trained: TrainedRef  # the round's checkpoint: RL's when RL ran, else SFT's
    sft: TrainedRef
    rl: RLRecord | None
    steps_run: int
    before: dict[str, Any]
    after: dict[str, Any]
    delta: dict[str, Any]  # paired on the held-out tasks where it can be
    markdown: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-ready values."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FlywheelResult:
    """A flywheel run: its id, the warehouse it prepared (``prepare_warehouse``), the untrained
    policy's evaluation, every round's record, the final evaluation and the overall difference;
    ``state``: for the demo, what was stored before it ran (new, interrupted, done)."""

    flywheel_id: str
    warehouse: dict[str, Any]
    untrained: dict[str, Any]
    rounds: list[RoundRecord]
    final: dict[str, Any]
    overall: dict[str, Any]
    state: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready values (its rounds as :meth:`RoundRecord.to_dict`)."""
        return dataclasses.asdict(self)


def round_record(
    n: int,
    collected: dict[str, CollectResult],
    judged: dict[str, Any],
    scored: dict[str, Any] | None,
    intervened: dict[str, Any] | None,
    dataset: dict[str, Any],
    trained: TrainResult,
    before: dict[str, Any],
    after: dict[str, Any],
    rl: TrainResult | None,
    start: str | None,
    delta: dict[str, Any],
) -> RoundRecord:
    """What round ``n`` did, from its stages' results (the round's artifact shows it);
    ``trained`` is the SFT result, ``rl`` RL's (its checkpoint is then the round's)."""
    final = rl if rl is not None else trained
    rl_record = None
    if rl is not None:
        its = [dataclasses.asdict(i) for i in rl.iterations]
        rl_record = RLRecord(rl.training_run_id, rl.checkpoint_id, its)
    return RoundRecord(
        round=n,
        collected=dict(collected),
        judged=judged,
        scored=scored,
        intervened=intervened,
        dataset=dataset,
        start=start or ("a fresh ranker" if n == 1 else f"round {n - 1}'s checkpoint"),
        trained=TrainedRef.of(final),
        sft=TrainedRef.of(trained),
        rl=rl_record,
        steps_run=trained.steps_run + (rl.steps_run if rl is not None else 0),
        before=before,
        after={**after, "label": f"round {n}"},
        delta=delta,
    )
