"""The ``train_sft`` and ``train_rl`` stages: sequencing of the trainer (``training``);
``flows.train`` runs them as Prefect flows.

* ``train_sft``: a curated dataset's SFT rows (split ``train``) → the one trainer with the SFT
  objective → checkpoints under ``$WEBLOOP_HOME/checkpoints/<training_run_id>/``, each registered
  in ``checkpoints``; per-step metrics in ``metrics``. The run id derives from the model, the
  dataset id and the config, so the same command resumes from the last checkpoint.
* ``train_rl``: on-policy iterations from a checkpoint: serve it as a rollout policy, collect G
  samples per task (graded as they end), compute advantages with a registered estimator, update
  (PPO-clip, or weighted regression for ``awr``), and go on from the new checkpoint. Every
  iteration's collect run and update are resumable; a finished iteration is skipped on re-run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from curation.curriculum import horizon_at
from judging.prm import needs
from serving.supervisor import vllm_python
from stages import runs
from stages.collect import CollectConfig, run_collect, select_tasks
from stages.config import ConfigError, setting
from stages.identity import Identity
from stages.judge import (
    JudgeConfig,
    check_judge,
    check_judge_fits,
    judge_setting,
    judges,
    run_judge_async,
)
from stages.report import markdown_table
from stages.runs import code_version
from stages.score_steps import ScoreStepsConfig, run_score_steps_async
from stages.served import ServedCheckpoints, serving_checkpoints
from training import registry
from training.advantages import SPECS, estimator_spec, names_at
from training.data import check_modality, find_dataset, sft_turns
from training.interface import DataMismatch
from training.load import ModelSpec, model_kind, resolve_policy
from training.rl import prepare
from training.trackers import Trackers, parse_report_to
from warehouse import Warehouse

if TYPE_CHECKING:  # (the trainer imports torch: only when a stage trains)
    from training.trainer import TrainConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ComputeConfig:
    """How a training run runs (processes, sharding, precision, trackers), not what it trains:
    none of it names a run, so a run started on one process resumes on eight."""

    num_processes: int = setting(
        1,
        help="Training processes on this machine (one per GPU): the update is data-parallel "
        "(ddp) or sharded (fsdp) across them; 1: in this process.",
        min=1,
        max=1024,
    )
    strategy: Literal["ddp", "fsdp"] = setting(
        "ddp", help="Many processes: ddp (a whole model each) or fsdp (parameters sharded)."
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = setting(
        "no", help="Autocast precision of the forward pass (accelerate's): no, bf16 or fp16."
    )
    grad_accum: int = setting(
        1,
        help="Micro-batches each process splits its share of a step into (the step's "
        "gradient is the same; memory is lower).",
        min=1,
        max=4096,
    )
    report_to: str = setting(
        "none",
        help="Experiment trackers beside the warehouse: none, all, or any of tensorboard, "
        "mlflow, wandb (comma-separated).",
    )

    def check(self) -> None:
        """An unknown tracker → :class:`ConfigError` naming the field."""
        from training.trackers import TrackerError, parse_report_to

        try:
            parse_report_to(self.report_to)
        except TrackerError as exc:
            raise ConfigError(f"compute.{exc}") from None


def _compute() -> ComputeConfig:
    return ComputeConfig()


_COMPUTE_FLAGS = ("num_processes", "strategy", "mixed_precision", "grad_accum", "report_to")


@dataclass(frozen=True)
class SFTConfig:
    """An SFT run: dataset (name or id), model (``ranker``, ``tiny`` or a folder), optimiser."""

    dataset: str = setting(help="Dataset name or id (webloop datasets list).")
    model: str = setting("ranker", help="ranker (new), tiny (offline tiny VLM) or a model folder.")
    epochs: int = setting(3, help="Passes over the dataset.", min=1, max=10_000)
    lr: float = setting(1e-3, help="Learning rate.", min=1e-12, max=10.0)
    batch_size: int = setting(32, help="Turns per optimiser step.", min=1, max=100_000)
    seed: int = setting(0, help="Initialisation and data-order seed.", min=0, max=2**32 - 1)
    max_steps: int | None = setting(None, help="Stop after this many steps.", min=1)
    save_every: int = setting(200, help="Checkpoint every N steps.", min=1)
    splits: tuple[str, ...] = setting(("train",), help="Dataset splits to train on.", cli=False)
    reasoning_weight: float = setting(
        1.0, help="VLM: weight of thought tokens (RL4VLM λ).", min=0.0, max=1.0
    )
    lora_r: int | None = setting(None, help="VLM: LoRA rank (peft).", min=1, max=4096)
    text_only: bool = setting(False, help="VLM: train on prompts without screenshots, on purpose.")
    compute: ComputeConfig = setting(
        factory=_compute,
        help="Processes, sharding, precision and trackers (a compute config).",
        cli_fields=_COMPUTE_FLAGS,
    )

    def identity(self) -> dict[str, Any]:
        """What names the run (the one rule of :mod:`stages.identity`): not the dataset's name
        (its id does), nor how it runs, nor where it stops and how often it saves (they do not
        change what it trains: a run stopped by --max-steps continues when the command is given
        again without it)."""
        return Identity(excluded=("dataset", "compute", "max_steps", "save_every")).of(self)


def checkpoints_dir(wh: Warehouse, training_run_id: str) -> Path:
    return wh.cfg.home / "checkpoints" / training_run_id


@dataclass(frozen=True)
class RLIteration:
    """One RL iteration: its collect run, what its batch held, the updates it made and the
    checkpoint after it (the one before it when the batch had no learning signal)."""

    iteration: int
    collect_run: str
    trajectories: int
    mean_reward: float
    turns: int
    nonzero_advantage: int
    steps_run: int
    checkpoint: str | None
    checkpoint_id: str | None
    # the rest of what `prepare` counted (rows, rewarded_rows: turns with a reward)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    # seconds: rollout_s (collect, and the PRM's scoring), judge_s, update_s, sync_s and the
    # served model's start_s; and the sync's parity_* figures
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    # the checkpoint folder the served model rolled out from (None: in-process, or no rollout ran)
    served_from: str | None = None


@dataclass(frozen=True)
class TrainResult:
    """What a training run did. ``training_run_id`` is None when RL made no update (no
    iteration's batch had a learning signal): the checkpoint is then the start one."""

    training_run_id: str | None
    checkpoint_id: str | None
    checkpoint: str | None
    steps_run: int = 0
    last_step: int = 0
    resumed_from: int | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    dataset_id: str | None = None
    snapshot_id: int | None = None
    iterations: tuple[RLIteration, ...] = ()


def _vlm_options(reasoning_weight: float, lora_r: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"reasoning_weight": reasoning_weight}
    if lora_r:
        opts["lora"] = {"r": lora_r, "alpha": 2 * lora_r}
    return opts


def run_sft(wh: Warehouse, cfg: SFTConfig, progress: Progress | None = None) -> TrainResult:
    """Train (or resume) the SFT run of ``cfg``; a summary with the final checkpoint."""
    from training.trainer import TrainConfig

    say = progress or (lambda _line: None)
    cfg.compute.check()
    ds = find_dataset(wh, cfg.dataset)
    turns = sft_turns(ds.export_path, cfg.splits)
    spec = ModelSpec(
        cfg.model, str(wh.cfg.home), cfg.seed, _vlm_options(cfg.reasoning_weight, cfg.lora_r)
    )
    model = spec.load()
    check_modality(model.kind, turns, f"dataset {ds.name} ({ds.dataset_id})", cfg.text_only)
    model.check_data(turns)  # before anything is recorded
    run_id = registry.training_run_id("sft", cfg.model, ds.dataset_id, cfg.identity())
    say(f"  sft {run_id}: {len(turns)} turns of {ds.name} ({ds.dataset_id}), model {cfg.model}")
    train_cfg = TrainConfig(
        objective="sft",
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        max_steps=cfg.max_steps,
        save_every=cfg.save_every,
    )
    config = {**cfg.identity(), "dataset": ds.dataset_id, "flow_run_id": runs.orchestrator_run()}
    lineage = {"stage": "sft", "dataset_id": ds.dataset_id, "snapshot_id": ds.snapshot_id}
    trackers = _trackers(wh, cfg.compute, run_id, config, lineage)
    status = "failed"
    try:
        res, _row = _fit(
            wh,
            _Model(model, spec),
            turns,
            train_cfg,
            run_id=run_id,
            stage="sft",
            base_model=cfg.model,
            dataset_id=ds.dataset_id,
            source_run=None,
            config=config,
            progress=say,
            compute=cfg.compute,
            trackers=trackers,
        )
        status = "completed"
    finally:
        trackers.close(status)
    return dataclasses.replace(res, dataset_id=ds.dataset_id, snapshot_id=ds.snapshot_id)


@dataclass(frozen=True)
class _Model:
    """A loaded trainable model and how to load it again (in each training process)."""

    model: Any
    spec: ModelSpec


def _trackers(
    wh: Warehouse,
    compute: ComputeConfig,
    run_id: str,
    config: dict[str, Any],
    lineage: dict[str, Any],
) -> Trackers:
    """The run's experiment trackers (``compute.report_to``), under ``$WEBLOOP_HOME/trackers``."""
    names = parse_report_to(compute.report_to)
    root = wh.cfg.home / "trackers"
    info = {**lineage, "training_run_id": run_id, "code_version": code_version()}
    return Trackers(names, root=root, run=run_id, config=config, lineage=info)


def _fit(
    wh: Warehouse,
    model: _Model,
    turns: list,
    train_cfg: TrainConfig,
    *,
    run_id: str,
    stage: str,
    base_model: str,
    dataset_id: str | None,
    source_run: str | None,
    config: dict[str, Any],
    progress: Progress,
    compute: ComputeConfig,
    trackers: Trackers,
    step_offset: int = 0,
    out_dir: Path | None = None,
    ref_model: _Model | None = None,
    anchor: list | None = None,
) -> tuple[TrainResult, Any]:
    """One ``fit`` with the warehouse bookkeeping around it (in this process, or on
    ``compute.num_processes`` ranks whose rank 0 reports here); its result and the run's row."""

    row = registry.start_run(
        wh,
        run_id,
        stage=stage,
        base_model=base_model,
        dataset_id=dataset_id,
        source_run=source_run,
        config=config,
        code_version=code_version(),
    )
    metrics_log = registry.MetricsLog(wh, run_id)

    def log(step: int, values: dict[str, float]) -> None:
        metrics_log(step_offset + step, values)
        trackers.log(step_offset + step, values)

    def on_checkpoint(step: int, path: Path) -> None:
        metrics_log.flush()
        registry.register_checkpoint(wh, run_id, step_offset + step, path)

    out = out_dir or checkpoints_dir(wh, run_id)
    callbacks = {"log": log, "on_checkpoint": on_checkpoint, "progress": _bar(progress, stage)}
    try:
        res = _run_fit(model, turns, train_cfg, out, compute, ref_model, anchor or [], callbacks)
    except BaseException:
        metrics_log.flush()
        if stage != "rl":
            registry.end_run(wh, row, "failed")
        raise
    metrics_log.flush()
    final = Path(res.final_checkpoint)
    cid = registry.register_checkpoint(wh, run_id, step_offset + res.last_step, final)
    if stage != "rl":
        registry.end_run(wh, row, "completed")
    result = TrainResult(
        training_run_id=run_id,
        checkpoint_id=cid,
        checkpoint=str(final),
        steps_run=res.steps_run,
        last_step=step_offset + res.last_step,
        resumed_from=res.resumed_from,
        metrics=dict(res.last_metrics or {}),
    )
    return result, row


def _run_fit(
    model: _Model,
    turns: list,
    train_cfg: TrainConfig,
    out: Path,
    compute: ComputeConfig,
    ref_model: _Model | None,
    anchor: list,
    callbacks: dict[str, Any],
) -> Any:
    """``training.trainer.fit`` here, or on ``compute.num_processes`` ranks (its launcher)."""
    from training.parallel import ParallelConfig

    parallel = ParallelConfig(compute.strategy, compute.mixed_precision, compute.grad_accum)
    if compute.num_processes > 1:
        from training.launch import Job, fit_processes

        ref = ref_model.spec if ref_model is not None else None
        job = Job(model.spec, turns, train_cfg, str(out), parallel, ref, anchor)
        return fit_processes(job, compute.num_processes, **callbacks)
    from training.trainer import fit

    ref = ref_model.model if ref_model is not None else None
    return fit(
        model.model,
        turns,
        train_cfg,
        out,
        ref_model=ref,
        anchor=anchor,
        parallel=parallel,
        **callbacks,
    )


def _bar(say: Progress, stage: str) -> Callable[[int, int], None]:
    """The trainer's step counter: a live bar's ``steps`` (:class:`cli.progress.LiveProgress`)
    when ``say`` has one, else a line per tenth of the run."""
    steps = getattr(say, "steps", None)
    if callable(steps):
        return steps
    last = [-1]

    def progress(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth != last[0]:
            last[0] = tenth
            say(f"  {stage}: step {done}/{total}")

    return progress


# -- RL -------------------------------------------------------------------------------------------


def rl_rollout() -> CollectConfig:
    """RL's rollouts by default: 32 train tasks × 4 samples at temperature 1, actions waiting
    3 s. The policy and model are the current checkpoint's, set each iteration."""
    return CollectConfig(n_tasks=32, samples=4, temperature=1.0, action_timeout_s=3.0)


def rl_prm() -> ScoreStepsConfig:
    """The step-level estimators' scoring of visited states by default: the exact PRM on the
    policy's 4 likeliest actions per state. Which states, by which policy, is set each iteration."""
    return ScoreStepsConfig(candidates="top_k")


#: RL's rollout fields that named RL runs before the configs composed, by their old names: a
#: configuration that sets only these keeps its run id (warehouses resume).
_ROLLOUT_KEYS = {
    "n_tasks": "n_tasks",
    "samples": "group_size",
    "split": "split",
    "suite": "suite",
    "temperature": "temperature",
    "max_steps": "max_steps",
    "seed": "seed",
    "site_seed": "site_seed",
    "action_timeout_s": "action_timeout_s",
}
_PRM_KEYS = {
    "scorer": "prm_scorer",
    "k": "prm_k",
    "candidates": "prm_candidates",
    "max_states": "prm_max_states",
    "scorer_base_url": "prm_scorer_base_url",
    "scorer_model": "prm_scorer_model",
}
#: Set by RL each iteration (from the current checkpoint, the iteration, the collected run), or
#: operational: not part of an RL run's identity.
_ROLLOUT_SET = ("policy", "model", "prompt_mode", "run_name", "concurrency", "workers")
_ROLLOUT_SET += ("dask_address", "lease_wait_s", "task_ids")
_PRM_SET = ("run", "policy", "model", "temperature", "prompt_mode", "seed", "concurrency")
_PRM_SET += ("action_timeout_s", "workers", "dask_address")


@dataclass(frozen=True)
class RLConfig:
    """On-policy RL from a checkpoint (id, training run id or folder): collect G samples per
    task (``rollout``, a collect config), advantages, update, repeat. ``step_grpo`` and
    ``step_awr`` / ``step_best`` also take K candidates at each visited state and score them
    (``prm``, a score-steps config) before each update; ``awr``, ``step_awr`` and ``step_best``
    update by weighted regression, the others by PPO-clip. ``prm.scorer: reference`` labels the
    states during the rollouts themselves (the reference's next step on the live page, bundled
    tasks) and scores candidates against those labels, with no replay; ``buffer`` trains each
    iteration on every iteration's scored states so far (DAgger's aggregate)."""

    policy: str = setting(help="Start checkpoint (id, training run or folder).")
    estimator: str = setting(
        "grpo",
        help=f"Advantage estimator: {', '.join(sorted(SPECS))}, or one registered by a module "
        "in WEBLOOP_PLUGINS.",
    )
    buffer: bool = setting(
        False,
        help="Step-level estimators: each update trains on the scored states of every "
        "iteration so far, not only this one's (DAgger's aggregated data set).",
    )
    iterations: int = setting(2, help="On-policy iterations.", min=1, max=10_000)
    horizon: tuple[int, ...] = setting(
        (),
        help="Per-iteration step budgets (a recipe's horizon schedule, TTI); the last repeats.",
        cli=False,
    )
    lr: float = setting(1e-3, help="Learning rate.", min=1e-12, max=10.0)
    batch_size: int = setting(32, help="Turns per optimiser step.", min=1, max=100_000)
    ppo_epochs: int = setting(2, help="Passes over an iteration's batch.", min=1, max=100)
    clip_eps: float = setting(0.2, help="PPO clip range.", min=0.001, max=1.0)
    kl_coef: float = setting(0.0, help="KL penalty weight.", min=0.0, max=100.0)
    reasoning_weight: float = setting(
        1.0, help="VLM: weight of thought tokens (RL4VLM λ).", min=0.0, max=1.0, cli=False
    )
    estimator_options: dict[str, Any] = setting(
        factory=dict, help="Options of the advantage estimator.", cli=False
    )
    anchor_dataset: str | None = setting(
        None,
        help="A curated dataset whose SFT rows anchor each update (PPO-ptx; typically the one "
        "the start checkpoint was trained on).",
    )
    anchor_coef: float = setting(
        0.0, help="Weight of the anchor's SFT loss (0: none).", min=0.0, max=100.0
    )
    task_pool: int = setting(
        0,
        help="Failures-first curriculum: run the policy greedily on this many tasks first, "
        "sample on the --n-tasks it failed (then solved) ones (0: off).",
        min=0,
    )
    rollout: CollectConfig = setting(
        factory=rl_rollout,
        help="Each iteration's rollouts (a collect config; the seed is the first iteration's, "
        "each iteration adds its index; defaults: rl_rollout).",
        cli_fields=("n_tasks", "samples", "temperature", "max_steps", "seed", "concurrency"),
        flags={"samples": "--group-size"},
    )
    prm: ScoreStepsConfig = setting(
        factory=rl_prm,
        help="step_*: the scoring of visited states (a score-steps config; defaults: rl_prm).",
        cli_fields=(
            "scorer",
            "k",
            "candidates",
            "max_states",
            "expert_candidate",
            "select",
            "scorer_base_url",
            "scorer_model",
        ),
        prefix="prm-",
    )
    serve: Literal["auto", "hf", "vllm", "in-process"] = setting(
        "auto",
        help="Where a VLM's rollouts run: served behind the OpenAI protocol (auto: vLLM where "
        "`make vllm` built it, else webloop's hf engine), weights synced after each update; or "
        "in-process. The ranker always runs in-process.",
    )
    parity_tol: float = setting(
        0.05,
        help="Served VLM: largest per-token log-prob difference between server and trainer "
        "at a sync (more stops the run).",
        min=0.0,
        max=100.0,
    )
    judge: JudgeConfig = judge_setting(
        "The reward judge (a judge config): 'none' rewards the rollouts' own outcome (the "
        "bundled checkers); a judge judges each iteration's rollouts and its verdicts are the "
        "rewards (what it cannot decide gets none, never a failure's).",
        flag="--reward-judge",
        prefix="reward-judge-",
    )

    compute: ComputeConfig = setting(
        factory=_compute,
        help="The update's processes, sharding, precision and trackers (a compute config; "
        "rollouts stay with the served model).",
        cli_fields=_COMPUTE_FLAGS,
    )

    def identity(self) -> dict[str, Any]:
        """What names the run: the fields RL had before its configs composed under their old
        names (so earlier runs resume), then any other rollout or PRM setting changed from
        RL's defaults (``rollout.noise``, …)."""
        d = RL_IDENTITY.of(self)  # (the nested configs' and the judge's parts are added below)
        d.update({old: getattr(self.rollout, new) for new, old in _ROLLOUT_KEYS.items()})
        d.update(_changed("rollout", self.rollout, rl_rollout(), {*_ROLLOUT_KEYS, *_ROLLOUT_SET}))
        if _step_level(self.estimator):  # (the other estimators' run ids stay as they were)
            d.update({old: getattr(self.prm, new) for new, old in _PRM_KEYS.items()})
            d.update(_changed("prm", self.prm, rl_prm(), {*_PRM_KEYS, *_PRM_SET}))
        if judges(self.judge):  # added later: runs rewarded by their own outcome keep their ids
            d["reward_judge"] = {k: v for k, v in self.judge.identity().items() if k != "run"}
        return d

    @property
    def n_tasks(self) -> int:
        return self.rollout.n_tasks

    @property
    def group_size(self) -> int:
        return self.rollout.samples

    @property
    def seed(self) -> int:
        return self.rollout.seed

    def check(self) -> None:
        """Settings that cannot work together → :class:`DataMismatch` (the CLI's usage error),
        before anything starts."""
        if self.estimator not in SPECS:
            raise DataMismatch(
                f"unknown advantage estimator {self.estimator!r}; known: "
                f"{', '.join(sorted(SPECS))} (your own: training.advantages.register, its "
                "module in WEBLOOP_PLUGINS)"
            )
        if self.anchor_coef and not self.anchor_dataset:
            raise DataMismatch(
                f"anchor_coef {self.anchor_coef} needs an anchor dataset (--anchor-dataset: "
                "the SFT rows it weighs)"
            )
        check_judge_fits(self.judge, self.rollout.suite, "judge", "rewards from own outcomes")
        self.compute.check()
        if self.serve == "vllm" and vllm_python() is None:
            raise ConfigError(
                "serve: vllm needs the vLLM environment: run `make vllm` first (or serve: auto, "
                "which takes webloop's hf engine without it)"
            )
        bundled = _step_level(self.estimator) and needs(self.prm.scorer, "bundled")
        if bundled and self.rollout.suite != "bundled":
            raise ConfigError(
                f"prm.scorer: {self.prm.scorer} needs the bundled sites' reference solutions; "
                f"suite {self.rollout.suite!r} has none (use the vlm scorer, or estimator grpo)"
            )
        if self.buffer and not _step_level(self.estimator):
            raise DataMismatch(
                f"buffer: keeps the scored states of earlier iterations, for the step-level "
                f"estimators ({', '.join(names_at('step'))}); not {self.estimator!r}"
            )
        if self.task_pool and self.task_pool <= self.n_tasks:
            raise DataMismatch(
                f"task_pool {self.task_pool} must exceed n_tasks {self.n_tasks} (--task-pool, "
                "--n-tasks: the curriculum picks n_tasks of the pool), or be 0"
            )


def _changed(name: str, cfg: Any, default: Any, known: set[str]) -> dict[str, Any]:
    """``cfg``'s fields outside ``known`` that differ from ``default``'s, as ``name.field``."""
    return {
        f"{name}.{f.name}": getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name not in known and getattr(cfg, f.name) != getattr(default, f.name)
    }


async def run_rl(
    wh: Warehouse,
    cfg: RLConfig,
    progress: Progress | None = None,
    *,
    server: Any = None,
    browser: Any = None,
    served: ServedCheckpoints | None = None,
) -> TrainResult:
    """Run (or resume) ``cfg.iterations`` on-policy iterations; a summary per iteration. An
    iteration whose batch has no learning signal (every group's samples got the same reward)
    makes no update; if no iteration trained, the start checkpoint is the result. ``served``: a
    running model server to roll a VLM out on (the caller's: left running; by default one is
    started per ``cfg.serve`` and stopped at the end)."""
    say = progress or (lambda _line: None)
    cfg.check()
    if judges(cfg.judge):
        check_judge(cfg.judge)  # a bad reward judge is refused before any rollout
    start = resolve_policy(wh, _policy_name(cfg.policy, wh), cfg.policy)
    anchor, anchor_id = _anchor(wh, cfg)
    run_id = registry.training_run_id("rl", start.model or cfg.policy, anchor_id, cfg.identity())
    out_root = checkpoints_dir(wh, run_id)
    # the KL term keeps the policy near where RL started (the start checkpoint, frozen)
    ref = _load(wh, start.model, cfg) if cfg.kl_coef > 0 else None
    own = served is None
    served = _served(cfg, start, out_root) if own else served
    config = {**cfg.identity(), "start_checkpoint": start.checkpoint_id}
    lineage = {"stage": "rl", "dataset_id": anchor_id, "start_checkpoint": start.checkpoint_id}
    trackers = _trackers(wh, cfg.compute, run_id, config, lineage)
    loop = _Loop(wh, cfg, say, server, browser, run_id, start, ref, served, anchor, anchor_id)
    loop.trackers = trackers
    status = "failed"
    try:
        with serving_checkpoints(served, stop=own):
            for it in range(cfg.iterations):
                await loop.iteration(it)
        status = "completed"
    finally:
        trackers.close(status)
    row, rounds, current = loop.row, loop.rounds, loop.current
    if row is not None:
        registry.end_run(wh, row, "completed")
    last = loop.last
    step_offset = loop.step_offset
    return TrainResult(
        # None when no iteration trained (none had a learning signal): no run was registered
        training_run_id=run_id if row is not None else None,
        checkpoint_id=current.checkpoint_id,
        checkpoint=current.model,
        steps_run=sum(r.steps_run for r in rounds),
        last_step=step_offset,
        metrics=last.metrics if last is not None else {},
        dataset_id=anchor_id,
        iterations=tuple(rounds),
    )


def _first_infra_error(wh: Warehouse, run_id: str) -> str:
    """``; infrastructure error: …`` (the first) when some episode of the run had one."""
    df = wh.sql(
        "SELECT error FROM trajectories WHERE run_id = ? AND status = 'infra_error' "
        "AND error IS NOT NULL ORDER BY traj_id LIMIT 1",
        [run_id],
    )
    return "" if df.is_empty() else f"; infrastructure error: {str(df.item())[:300]}"


def _served(cfg: RLConfig, start: Any, out_root: Path) -> ServedCheckpoints | None:
    """The server of a VLM run's rollouts (None: the ranker, ``serve: in-process``, or rollouts
    that act by the candidates choice, which scores its candidates in-process)."""
    if cfg.serve == "in-process" or start.policy != "hf" or cfg.rollout.choose != "generate":
        return None
    return ServedCheckpoints(
        engine=cfg.serve, log_dir=out_root, parity_tol=cfg.parity_tol, reload_root=out_root
    )


@dataclass
class _Loop:
    """The state RL's iterations carry: the current checkpoint, the training run row, the step
    count, the iterations' records; :meth:`iteration` runs one."""

    wh: Warehouse
    cfg: RLConfig
    say: Progress
    server: Any
    browser: Any
    run_id: str
    start: Any
    ref: Any
    served: ServedCheckpoints | None
    anchor: list
    anchor_id: str | None
    current: Any = None
    step_offset: int = 0
    row: Any = None
    last: Any = None
    rounds: list[RLIteration] = dataclasses.field(default_factory=list)
    trackers: Any = None

    def __post_init__(self) -> None:
        self.current = self.start

    async def iteration(self, it: int) -> None:
        """Collect, judge (score), update, save and sync: iteration ``it``."""
        wh, cfg, say = self.wh, self.cfg, self.say
        timing: dict[str, float] = {}
        t0 = time.monotonic()
        coll = _collect_config(cfg, it, self.current, self.run_id)
        if cfg.task_pool:
            picked = await _failures_first(wh, coll, cfg, it, say, self.server, self.browser)
            coll = dataclasses.replace(coll, task_ids=picked)
        say(f"  rl iteration {it + 1}/{cfg.iterations}: collect {cfg.n_tasks} × {cfg.group_size}")
        # a live bar (it has ``steps``) also shows the collection's episodes
        live = say if callable(getattr(say, "steps", None)) else None
        col = await run_collect(wh, coll, live, server=self.server, browser=self.browser)
        say(
            f"  rl iteration {it + 1}: rolled out {col.ran} {dict(col.by_status)}, "
            f"{col.skipped} stored" + _first_infra_error(wh, col.run_id)
        )
        options = dict(cfg.estimator_options)
        if _step_level(cfg.estimator):
            await _score_states(
                wh, cfg, it, self.current, col.run_id, say, self.server, self.browser
            )
            options["scorer"] = cfg.prm.scorer
        timing["rollout_s"] = time.monotonic() - t0
        served_from = self.served.serving if self.served is not None else None
        t0 = time.monotonic()
        judge = await _judge_rollouts(wh, cfg, it, col.run_id, say)
        sources = [col.run_id]
        if cfg.buffer:  # DAgger: every iteration's scored states so far
            sources = [*(r.collect_run for r in self.rounds), col.run_id]
        turns, stats = prepare(wh, sources, cfg.estimator, judge=judge, **options)
        timing["judge_s"] = time.monotonic() - t0
        say(
            f"  rl iteration {it + 1}: {stats['trajectories']} trajectories, mean reward "
            f"{stats['mean_reward']:.3f}, {stats['nonzero_advantage']}/{stats['turns']} turns "
            "with a learning signal"
        )
        if stats["nonzero_advantage"] == 0:
            # every group's samples got the same reward: no gradient. As GRPO loops do, the
            # iteration makes no update (the policy stays as it is) instead of failing the run.
            say(f"  rl iteration {it + 1}: no learning signal; the policy is unchanged")
            timing.update(self.served.take_timings() if self.served is not None else {})
            record = _iteration(it, col.run_id, stats, 0, self.current, timing)
            self.rounds.append(dataclasses.replace(record, served_from=served_from))
            return
        t0 = time.monotonic()
        model = _load(wh, self.current.model, cfg)
        res, self.row = _fit(
            wh,
            model,
            turns,
            _rl_train_config(cfg, it),
            run_id=self.run_id,
            stage="rl",
            base_model=self.start.model or cfg.policy,
            dataset_id=self.anchor_id,
            source_run=col.run_id,
            config={
                **cfg.identity(),
                "start_checkpoint": self.start.checkpoint_id,
                "flow_run_id": runs.orchestrator_run(),
            },
            progress=say,
            compute=cfg.compute,
            trackers=self.trackers,
            step_offset=self.step_offset,
            out_dir=checkpoints_dir(wh, self.run_id) / f"iter-{it}",
            ref_model=self.ref,
            anchor=self.anchor,
        )
        timing["update_s"] = time.monotonic() - t0
        if cfg.compute.num_processes > 1 and self.served is not None:
            model = _load(wh, res.checkpoint, cfg)  # the ranks trained; this copy did not
        self.current = dataclasses.replace(
            self.current, model=res.checkpoint, checkpoint_id=res.checkpoint_id
        )
        if self.served is not None:
            timing.update(self._sync(it, model.model, turns))
        timing.update(self.served.take_timings() if self.served is not None else {})
        values = {"mean_reward": stats["mean_reward"], "iteration": float(it), **timing}
        registry.MetricsLog(wh, self.run_id, every=1)(res.last_step, values)
        self.trackers.log(res.last_step, values)
        self.step_offset, self.last = res.last_step, res
        record = _iteration(it, col.run_id, stats, res.steps_run, self.current, timing)
        self.rounds.append(dataclasses.replace(record, served_from=served_from))

    def _sync(self, it: int, model: Any, turns: list) -> dict[str, float]:
        """Serve the new checkpoint (in place where the engine can) and check log-prob parity
        between the server and the trainer's model of it; the figures for the metrics."""
        assert self.served is not None
        how, took = self.served.sync(str(self.current.model))
        if how == "none":  # the server never started (nothing was rolled out by it)
            return {}
        parity = self.served.parity(model, turns)
        self.say(
            f"  rl iteration {it + 1}: weights synced ({how}, {took:.1f} s); log-prob parity "
            f"over {parity.tokens} tokens of {parity.prompts} prompts: max |diff| "
            f"{parity.max_abs_diff:.2e}"
        )
        return {
            "parity_max_abs_diff": parity.max_abs_diff,
            "parity_tokens": float(parity.tokens),
            "parity_retokenized_differently": float(parity.retokenized_differently),
            "sync_in_place": 1.0 if how == "reload" else 0.0,
        }


def _iteration(
    it: int,
    collect_run: str,
    stats: dict[str, Any],
    steps: int,
    policy: Any,
    timing: dict[str, float] | None = None,
) -> RLIteration:
    """Iteration ``it``'s record (``policy``: the checkpoint after it)."""
    return RLIteration(
        iteration=it,
        collect_run=collect_run,
        trajectories=stats["trajectories"],
        mean_reward=stats["mean_reward"],
        turns=stats["turns"],
        nonzero_advantage=stats["nonzero_advantage"],
        steps_run=steps,
        checkpoint=policy.model,
        checkpoint_id=policy.checkpoint_id,
        stats={k: v for k, v in stats.items() if k not in _ITERATION_FIELDS},
        timing=dict(timing or {}),
    )


_ITERATION_FIELDS = {"trajectories", "mean_reward", "turns", "nonzero_advantage"}


async def _judge_rollouts(
    wh: Warehouse, cfg: RLConfig, it: int, collect_run: str, say: Progress
) -> str | None:
    """The reward judge over iteration ``it``'s rollouts (stored verdicts are kept: a re-run
    judges only what is left); its name, or None when the rollouts' own outcome rewards."""
    if not judges(cfg.judge):
        return None
    res = await run_judge_async(wh, dataclasses.replace(cfg.judge, run=collect_run))
    say(f"  rl iteration {it + 1}: reward judge {res.line}")
    return res.judge


def failures_first(order: list[str], status: dict[str, str], n: int) -> tuple[str, ...]:
    """``n`` task ids of ``order``: those whose probe episode was not a success, then the
    successes, each in ``order``; tasks without an outcome (no episode, ``infra_error``) are
    left out."""
    failed = [t for t in order if status.get(t) not in (None, "success", "infra_error")]
    solved = [t for t in order if status.get(t) == "success"]
    return tuple((failed + solved)[:n])


async def _failures_first(
    wh: Warehouse,
    coll: CollectConfig,
    cfg: RLConfig,
    it: int,
    say: Progress,
    server: Any,
    browser: Any,
) -> tuple[str, ...]:
    """The iteration's tasks by the failures-first curriculum: the current policy, greedy, on
    the first ``cfg.task_pool`` tasks of the seeded order (a collect run of its own, resumable);
    the ``cfg.n_tasks`` taken are the ones it did not solve, then the solved ones, in that order.
    Episodes that ended in an infrastructure error say nothing of the policy and are left out."""
    probe = dataclasses.replace(
        coll, n_tasks=cfg.task_pool, samples=1, temperature=0.0, run_name=f"{coll.run_name}-probe"
    )
    col = await run_collect(wh, probe, None, server=server, browser=browser)
    order = [t.task_id for t in select_tasks(wh, probe)]
    status = dict(
        wh.sql("SELECT task_id, status FROM trajectories WHERE run_id = ?", [col.run_id]).rows()
    )
    picked = failures_first(order, status, cfg.n_tasks)
    solved = sum(v == "success" for v in status.values())
    unsolved = sum(status[t] != "success" for t in picked)
    if not picked:
        raise DataMismatch(
            f"the curriculum's probe run {col.run_id} has no episode with an outcome "
            "(infrastructure errors only): nothing to pick the iteration's tasks from"
        )
    say(
        f"  rl iteration {it + 1}: probe of {len(order)} tasks (greedy): {solved} solved; "
        f"sampling on {unsolved} unsolved + {len(picked) - unsolved} solved"
    )
    return picked


async def _score_states(
    wh: Warehouse,
    cfg: RLConfig,
    it: int,
    policy: Any,
    collect_run: str,
    say: Progress,
    server: Any,
    browser: Any,
) -> None:
    """The step-level estimators' process rewards for one iteration: at the states it visited,
    ``cfg.prm.k`` candidates of the current policy, scored by ``cfg.prm.scorer`` (the
    score-steps stage; a re-run finds the scores already stored)."""
    sc = _score_config(cfg, it, policy, collect_run)
    res = await run_score_steps_async(wh, sc, server=server, browser=browser)
    say(
        f"  rl iteration {it + 1}: {res.selected} states, {res.scored} candidates scored "
        f"by {cfg.prm.scorer} ({res.errors} errors)"
    )


def _anchor(wh: Warehouse, cfg: RLConfig) -> tuple[list, str | None]:
    """The anchor dataset's SFT rows (split ``train``) and its id; none without an anchor."""
    if not cfg.anchor_coef:
        return [], None
    ds = find_dataset(wh, str(cfg.anchor_dataset))  # RLConfig.check: given with a coefficient
    return sft_turns(ds.export_path), ds.dataset_id


def _load(wh: Warehouse, model: str | None, cfg: RLConfig) -> _Model:
    spec = ModelSpec(
        str(model), str(wh.cfg.home), cfg.seed, _vlm_options(cfg.reasoning_weight, None)
    )
    return _Model(spec.load(), spec)


def _policy_name(ref: str, wh: Warehouse) -> str:
    """The rollout policy of a checkpoint reference (registered or a folder)."""
    row = registry.find_checkpoint(wh, ref)
    path = row["path"] if row is not None else ref
    return "ranker" if Path(path).is_dir() and model_kind(path) == "ranker" else "hf"


def _step_level(estimator: str) -> bool:
    """Whether ``estimator`` trains on PRM-scored candidates (unknown names: no; check() says)."""
    spec = SPECS.get(estimator)
    return spec is not None and spec.level == "step"


def _collect_config(cfg: RLConfig, it: int, policy: Any, run_id: str) -> CollectConfig:
    """Iteration ``it``'s rollouts: ``cfg.rollout`` by the current policy, seed and horizon."""
    engine = dict(cfg.rollout.engine)
    for flag in estimator_spec(cfg.estimator).engine:  # (turn: the share of criteria met)
        engine[flag] = True
    if _step_level(cfg.estimator) and needs(cfg.prm.scorer, "labels"):
        engine["label_reference"] = True  # the states' labels, taken during the rollouts
    return dataclasses.replace(
        cfg.rollout,
        policy=policy.policy,
        model=policy.model,
        max_steps=horizon_at(cfg.horizon, it, cfg.rollout.max_steps),
        seed=cfg.seed + it,
        prompt_mode=policy.prompt_mode,
        run_name=f"{run_id}-iter{it}",
        engine=engine,
    )


def _score_config(cfg: RLConfig, it: int, policy: Any, collect_run: str) -> ScoreStepsConfig:
    """Iteration ``it``'s scoring: ``cfg.prm`` at the states of ``collect_run``, candidates by
    the current policy at the rollouts' temperature."""
    return dataclasses.replace(
        cfg.prm,
        run=collect_run,
        policy=policy.policy,
        model=policy.model,
        temperature=cfg.rollout.temperature,
        prompt_mode=policy.prompt_mode,
        seed=cfg.seed + it,
    )


def _rl_train_config(cfg: RLConfig, it: int) -> TrainConfig:
    from training.trainer import TrainConfig

    return TrainConfig(
        objective=estimator_spec(cfg.estimator).objective,
        epochs=cfg.ppo_epochs,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        seed=cfg.seed + it,
        clip_eps=cfg.clip_eps,
        kl_coef=cfg.kl_coef,
        anchor_coef=cfg.anchor_coef,
        save_every=10_000,
    )


# -- artifacts ------------------------------------------------------------------------------------


def metrics_summary(wh: Warehouse, training_run_id: str) -> list[dict[str, Any]]:
    """Per metric of a training run: steps logged, first, last, min and max value."""
    return wh.sql(
        "SELECT name AS metric, count(*) AS steps, arg_min(value, step) AS first, "
        "arg_max(value, step) AS last, min(value) AS min, max(value) AS max "
        "FROM metrics WHERE training_run_id = ? GROUP BY name ORDER BY name",
        [training_run_id],
    ).to_dicts()


def training_markdown(stage: str, res: TrainResult, metrics: list[dict[str, Any]]) -> str:
    """A training run's result and metrics summary (and RL iterations) as markdown."""
    title = (
        f"# {stage} training run `{res.training_run_id}`"
        if res.training_run_id is not None
        else f"# {stage}: no update (no iteration's batch had a learning signal)"
    )
    lines = [
        title,
        "",
        f"checkpoint `{res.checkpoint_id}`: `{res.checkpoint}`",
        "",
        "## Metrics (first → last over the logged steps)",
        "",
        markdown_table(metrics, ["metric", "steps", "first", "last", "min", "max"]),
    ]
    if res.iterations:
        cols = ["iteration", "collect_run", "trajectories", "mean_reward", "steps_run"]
        rows = [dataclasses.asdict(i) for i in res.iterations]
        for r in rows:
            r.update({k: round(v, 3) for k, v in r["timing"].items()})
        cols += sorted({k for r in res.iterations for k in r.timing})
        lines += ["", "## Iterations", "", markdown_table(rows, cols)]
    return "\n".join(lines)


def _anchored(cfg: RLConfig) -> bool:
    return bool(cfg.anchor_coef)


RL_IDENTITY = Identity(
    # nested configs (their own rule, under their old names), the judge (its identity, when
    # one decides), how the update runs, where rollouts run and how closely they are checked
    excluded=("rollout", "prm", "judge", "compute", "serve", "parity_tol"),
    later=("task_pool", "buffer"),
    used={"anchor_dataset": _anchored, "anchor_coef": _anchored},
)
"""How an RL run is named, besides its nested configs' settings (:meth:`RLConfig.identity`)."""
