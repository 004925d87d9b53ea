"""The ``train_sft`` and ``train_rl`` flows: thin sequencing of the trainer (``training``).

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

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, task

from flows import prefect_env
from flows.artifacts import artifact_key, flow_run_id, publish
from stages.collect import CollectConfig, run_collect, select_tasks
from stages.report import markdown_table
from stages.runs import code_version
from stages.score_steps import ScoreStepsConfig, run_score_steps_async
from training import registry
from training.data import check_modality, find_dataset, sft_turns
from training.interface import DataMismatch
from training.load import load_trainable, model_kind, resolve_policy
from training.rl import STEP_LEVEL, WEIGHTED, prepare
from training.trainer import TrainConfig, fit
from warehouse import Warehouse, WarehouseConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SFTConfig:
    """An SFT run: dataset (name or id), model (``ranker``, ``tiny`` or a folder), optimiser."""

    dataset: str
    model: str = "ranker"
    epochs: int = 3
    lr: float = 1e-3
    batch_size: int = 32
    seed: int = 0
    max_steps: int | None = None
    save_every: int = 200
    splits: tuple[str, ...] = ("train",)
    reasoning_weight: float = 1.0
    lora_r: int | None = None
    text_only: bool = False  # a VLM on prompts without screenshots, on purpose

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("dataset")  # the dataset id (not its name) names the run
        # where a run stops and how often it saves do not change what it trains: a run stopped
        # by --max-steps continues when the command is given again without it
        d.pop("max_steps")
        d.pop("save_every")
        return d


def checkpoints_dir(wh: Warehouse, training_run_id: str) -> Path:
    return wh.cfg.home / "checkpoints" / training_run_id


def _vlm_options(reasoning_weight: float, lora_r: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {"reasoning_weight": reasoning_weight}
    if lora_r:
        opts["lora"] = {"r": lora_r, "alpha": 2 * lora_r}
    return opts


def run_sft(wh: Warehouse, cfg: SFTConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Train (or resume) the SFT run of ``cfg``; a summary with the final checkpoint."""
    say = progress or (lambda _line: None)
    ds = find_dataset(wh, cfg.dataset)
    turns = sft_turns(ds.export_path, cfg.splits)
    model = load_trainable(
        cfg.model,
        home=wh.cfg.home,
        seed=cfg.seed,
        vlm=_vlm_options(cfg.reasoning_weight, cfg.lora_r),
    )
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
    res = _fit(
        wh,
        model,
        turns,
        train_cfg,
        run_id=run_id,
        stage="sft",
        base_model=cfg.model,
        dataset_id=ds.dataset_id,
        source_run=None,
        config={**cfg.identity(), "dataset": ds.dataset_id, "flow_run_id": flow_run_id()},
        progress=say,
    )
    res.pop("row")
    return {**res, "dataset_id": ds.dataset_id, "snapshot_id": ds.snapshot_id}


def _fit(
    wh: Warehouse,
    model: Any,
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
    step_offset: int = 0,
    out_dir: Path | None = None,
    ref_model: Any = None,
    anchor: list | None = None,
) -> dict[str, Any]:
    """One ``fit`` with the warehouse bookkeeping around it."""
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
    log = registry.MetricsLog(wh, run_id)
    ckpts: dict[int, str] = {}

    def on_checkpoint(step: int, path: Path) -> None:
        log.flush()
        ckpts[step] = registry.register_checkpoint(wh, run_id, step_offset + step, path)

    out = out_dir or checkpoints_dir(wh, run_id)
    try:
        res = fit(
            model,
            turns,
            train_cfg,
            out,
            ref_model=ref_model,
            anchor=anchor or (),
            log=lambda step, values: log(step_offset + step, values),
            on_checkpoint=on_checkpoint,
            progress=_bar(progress, stage),
        )
    except BaseException:
        log.flush()
        if stage != "rl":
            registry.end_run(wh, row, "failed")
        raise
    log.flush()
    final = Path(res.final_checkpoint)
    cid = registry.register_checkpoint(wh, run_id, step_offset + res.last_step, final)
    if stage != "rl":
        registry.end_run(wh, row, "completed")
    return {
        "training_run_id": run_id,
        "checkpoint_id": cid,
        "checkpoint": str(final),
        "steps_run": res.steps_run,
        "last_step": step_offset + res.last_step,
        "resumed_from": res.resumed_from,
        "metrics": res.last_metrics,
        "row": row,
    }


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


@dataclass(frozen=True)
class RLConfig:
    """On-policy RL from a checkpoint (id, training run id or folder)."""

    policy: str
    estimator: str = "grpo"
    iterations: int = 2
    group_size: int = 4
    n_tasks: int = 32
    split: str = "train"
    suite: str = "bundled"
    temperature: float = 1.0
    max_steps: int = 30
    horizon: tuple[int, ...] = ()  # per-iteration max_steps (a recipe's horizon schedule)
    lr: float = 1e-3
    batch_size: int = 32
    ppo_epochs: int = 2
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    reasoning_weight: float = 1.0
    seed: int = 0
    site_seed: int = 0
    action_timeout_s: float = 3.0
    concurrency: int = 8
    estimator_options: dict[str, Any] = field(default_factory=dict)
    # step_grpo / step_awr: every iteration scores its states (score-steps) before the update:
    # ``prm_k`` candidates of the current policy at each state (``prm_candidates``: its K most
    # likely distinct actions where it can list them, else samples), scored by ``prm_scorer``
    prm_scorer: str = "exact"
    prm_k: int = 4
    prm_candidates: str = "top_k"
    prm_max_states: int | None = None
    prm_scorer_base_url: str | None = None
    prm_scorer_model: str | None = None
    # PPO-ptx: ``anchor_coef`` × the SFT loss on a curated dataset's SFT rows (``anchor_dataset``,
    # a name or id; typically the one the start checkpoint was trained on) joins every update,
    # so the states an iteration's batch does not cover keep what SFT taught them
    anchor_dataset: str | None = None
    anchor_coef: float = 0.0
    # failures-first task curriculum: > n_tasks, each iteration first runs the current policy
    # greedily on ``task_pool`` tasks (a collect run of its own, ``…-iter<i>-probe``) and samples
    # on ``n_tasks`` of them: those it failed, then those it solved (seeded order); 0: the first
    # ``n_tasks`` of the split in the seeded order
    task_pool: int = 0

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("concurrency")
        if self.estimator not in STEP_LEVEL:  # (the other estimators' run ids stay as they were)
            for k in [k for k in d if k.startswith("prm_")]:
                d.pop(k)
        if not self.anchor_coef:  # added later: runs without an anchor keep their ids
            d.pop("anchor_dataset")
            d.pop("anchor_coef")
        if not self.task_pool:  # likewise
            d.pop("task_pool")
        return d

    def check(self) -> None:
        """Settings that cannot work together → :class:`DataMismatch` (the CLI's usage error),
        before anything starts."""
        if self.anchor_coef and not self.anchor_dataset:
            raise DataMismatch(
                f"anchor_coef {self.anchor_coef} needs an anchor dataset (--anchor-dataset: "
                "the SFT rows it weighs)"
            )
        if self.task_pool and self.task_pool <= self.n_tasks:
            raise DataMismatch(
                f"task_pool {self.task_pool} must exceed n_tasks {self.n_tasks} (--task-pool, "
                "--n-tasks: the curriculum picks n_tasks of the pool), or be 0"
            )


async def run_rl(
    wh: Warehouse,
    cfg: RLConfig,
    progress: Progress | None = None,
    *,
    server: Any = None,
    browser: Any = None,
) -> dict[str, Any]:
    """Run (or resume) ``cfg.iterations`` on-policy iterations; a summary per iteration. An
    iteration whose batch has no learning signal (every group's samples got the same reward)
    makes no update; if no iteration trained, the start checkpoint is the result."""
    say = progress or (lambda _line: None)
    cfg.check()
    start = resolve_policy(wh, _policy_name(cfg.policy, wh), cfg.policy)
    anchor, anchor_id = _anchor(wh, cfg)
    run_id = registry.training_run_id("rl", start.model or cfg.policy, anchor_id, cfg.identity())
    out_root = checkpoints_dir(wh, run_id)
    current, step_offset, rounds = start, 0, []
    row = None
    # the KL term keeps the policy near where RL started (the start checkpoint, frozen)
    ref = _load(wh, start.model, cfg) if cfg.kl_coef > 0 else None
    for it in range(cfg.iterations):
        it_dir = out_root / f"iter-{it}"
        coll = _collect_config(cfg, it, current, run_id)
        if cfg.task_pool:
            picked = await _failures_first(wh, coll, cfg, it, say, server, browser)
            coll = dataclasses.replace(coll, task_ids=picked)
        say(f"  rl iteration {it + 1}/{cfg.iterations}: collect {cfg.n_tasks} × {cfg.group_size}")
        # a live bar (it has ``steps``) also shows the collection's episodes
        live = say if callable(getattr(say, "steps", None)) else None
        col = await run_collect(wh, coll, live, server=server, browser=browser)
        options = dict(cfg.estimator_options)
        if cfg.estimator in STEP_LEVEL:
            await _score_states(wh, cfg, it, current, col.run_id, say, server, browser)
            options["scorer"] = cfg.prm_scorer
        turns, stats = prepare(wh, [col.run_id], cfg.estimator, **options)
        say(
            f"  rl iteration {it + 1}: {stats['trajectories']} trajectories, mean reward "
            f"{stats['mean_reward']:.3f}, {stats['nonzero_advantage']}/{stats['turns']} turns "
            "with a learning signal"
        )
        if stats["nonzero_advantage"] == 0:
            # every group's samples got the same reward: no gradient. As GRPO loops do, the
            # iteration makes no update (the policy stays as it is) instead of failing the run.
            say(f"  rl iteration {it + 1}: no learning signal; the policy is unchanged")
            rounds.append(
                {
                    "iteration": it,
                    "collect_run": col.run_id,
                    **stats,
                    "steps_run": 0,
                    "checkpoint": current.model,
                    "checkpoint_id": current.checkpoint_id,
                }
            )
            continue
        model = _load(wh, current.model, cfg)
        res = _fit(
            wh,
            model,
            turns,
            _rl_train_config(cfg, it),
            run_id=run_id,
            stage="rl",
            base_model=start.model or cfg.policy,
            dataset_id=anchor_id,
            source_run=col.run_id,
            config={
                **cfg.identity(),
                "start_checkpoint": start.checkpoint_id,
                "flow_run_id": flow_run_id(),
            },
            progress=say,
            step_offset=step_offset,
            out_dir=it_dir,
            ref_model=ref,
            anchor=anchor,
        )
        row = res.pop("row")
        registry.MetricsLog(wh, run_id, every=1)(
            res["last_step"], {"mean_reward": stats["mean_reward"], "iteration": float(it)}
        )
        step_offset = res["last_step"]
        rounds.append({"iteration": it, "collect_run": col.run_id, **stats, **res})
        current = dataclasses.replace(
            current, model=res["checkpoint"], checkpoint_id=res["checkpoint_id"]
        )
    if row is not None:
        registry.end_run(wh, row, "completed")
    return {
        # None when no iteration trained (none had a learning signal): no run was registered
        "training_run_id": run_id if row is not None else None,
        "checkpoint_id": current.checkpoint_id,
        "checkpoint": current.model,
        "iterations": rounds,
    }


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
    ``cfg.prm_k`` candidates of the current policy, scored by ``cfg.prm_scorer`` (the
    score-steps stage; a re-run finds the scores already stored)."""
    sc = ScoreStepsConfig(
        scorer=cfg.prm_scorer,
        k=cfg.prm_k,
        run=collect_run,
        policy=policy.policy,
        model=policy.model,
        temperature=cfg.temperature,
        prompt_mode=policy.prompt_mode,
        candidates=cfg.prm_candidates,
        scorer_base_url=cfg.prm_scorer_base_url,
        scorer_model=cfg.prm_scorer_model,
        max_states=cfg.prm_max_states,
        seed=cfg.seed + it,
        concurrency=cfg.concurrency,
        action_timeout_s=cfg.action_timeout_s,
    )
    res = await run_score_steps_async(wh, sc, server=server, browser=browser)
    say(
        f"  rl iteration {it + 1}: {res.selected} states, {res.scored} candidates scored "
        f"by {cfg.prm_scorer} ({res.errors} errors)"
    )


def _anchor(wh: Warehouse, cfg: RLConfig) -> tuple[list, str | None]:
    """The anchor dataset's SFT rows (split ``train``) and its id; none without an anchor."""
    if not cfg.anchor_coef:
        return [], None
    ds = find_dataset(wh, str(cfg.anchor_dataset))  # RLConfig.check: given with a coefficient
    return sft_turns(ds.export_path), ds.dataset_id


def _load(wh: Warehouse, model: str | None, cfg: RLConfig) -> Any:
    return load_trainable(
        str(model), home=wh.cfg.home, seed=cfg.seed, vlm=_vlm_options(cfg.reasoning_weight, None)
    )


def _policy_name(ref: str, wh: Warehouse) -> str:
    """The rollout policy of a checkpoint reference (registered or a folder)."""
    row = registry.find_checkpoint(wh, ref)
    path = row["path"] if row is not None else ref
    return "ranker" if Path(path).is_dir() and model_kind(path) == "ranker" else "hf"


def _collect_config(cfg: RLConfig, it: int, policy: Any, run_id: str) -> CollectConfig:
    horizon = cfg.horizon[min(it, len(cfg.horizon) - 1)] if cfg.horizon else cfg.max_steps
    return CollectConfig(
        suite=cfg.suite,
        split=cfg.split,
        n_tasks=cfg.n_tasks,
        samples=cfg.group_size,
        policy=policy.policy,
        model=policy.model,
        max_steps=horizon,
        action_timeout_s=cfg.action_timeout_s,
        seed=cfg.seed + it,
        site_seed=cfg.site_seed,
        prompt_mode=policy.prompt_mode,
        temperature=cfg.temperature,
        concurrency=cfg.concurrency,
        run_name=f"{run_id}-iter{it}",
        # the turn estimator's credit: the share of criteria met after every step
        engine={"record_progress": True} if cfg.estimator == "turn" else {},
    )


def _rl_train_config(cfg: RLConfig, it: int) -> TrainConfig:
    return TrainConfig(
        objective="awr" if cfg.estimator in WEIGHTED else "ppo",
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


def training_markdown(stage: str, res: dict[str, Any], metrics: list[dict[str, Any]]) -> str:
    """A training run's result and metrics summary (and RL iterations) as markdown."""
    title = (
        f"# {stage} training run `{res['training_run_id']}`"
        if res["training_run_id"] is not None
        else f"# {stage}: no update (no iteration's batch had a learning signal)"
    )
    lines = [
        title,
        "",
        f"checkpoint `{res['checkpoint_id']}`: `{res['checkpoint']}`",
        "",
        "## Metrics (first → last over the logged steps)",
        "",
        markdown_table(metrics, ["metric", "steps", "first", "last", "min", "max"]),
    ]
    if res.get("iterations"):
        cols = ["iteration", "collect_run", "trajectories", "mean_reward", "steps_run"]
        lines += ["", "## Iterations", "", markdown_table(res["iterations"], cols)]
    return "\n".join(lines)


def publish_training(wh: Warehouse, stage: str, res: dict[str, Any]) -> None:
    publish(
        artifact_key("training", stage),
        training_markdown(stage, res, metrics_summary(wh, res["training_run_id"])),
        f"{stage} training run {res['training_run_id'] or '(no update)'}",
    )


# -- Prefect --------------------------------------------------------------------------------------


@task(name="train-sft")
def train_sft_task(cfg: SFTConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = run_sft(wh, cfg, prefect_env.progress_of("train"))
        publish_training(wh, "sft", res)
        return res


@flow(name="train_sft")
def train_sft_flow(cfg: SFTConfig, home: str | None = None) -> dict[str, Any]:
    """Supervised fine-tuning on a curated dataset; checkpoints registered in the warehouse."""
    return train_sft_task(cfg, home)


@task(name="train-rl")
def train_rl_task(cfg: RLConfig, home: str | None = None) -> dict[str, Any]:
    with Warehouse.open(WarehouseConfig.from_env(home=home)) as wh:
        res = asyncio.run(run_rl(wh, cfg, prefect_env.progress_of("train")))
        publish_training(wh, "rl", res)
        return res


@flow(name="train_rl")
def train_rl_flow(cfg: RLConfig, home: str | None = None) -> dict[str, Any]:
    """On-policy multi-turn RL iterations from a checkpoint."""
    return train_rl_task(cfg, home)


def train_sft(
    cfg: SFTConfig, home: str | None = None, on_progress: Progress | None = None
) -> dict[str, Any]:
    with prefect_env.progress_to("train", on_progress):
        return train_sft_flow(cfg, home)


def train_rl(
    cfg: RLConfig, home: str | None = None, on_progress: Progress | None = None
) -> dict[str, Any]:
    with prefect_env.progress_to("train", on_progress):
        return train_rl_flow(cfg, home)
