"""CLI commands of the training and evaluation stages: ``webloop train sft|rl``,
``webloop eval`` (+ ``eval compare``), ``webloop checkpoints list|lineage``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import Format, UserError, _open, console, print_frame

ESTIMATORS = ("grpo", "step_grpo", "step_awr", "awr", "turn")


def _estimator(value: str) -> str:
    if value not in ESTIMATORS:
        raise typer.BadParameter(
            f"unknown estimator {value!r}; choose from {', '.join(ESTIMATORS)}"
        )
    return value


def _horizon(text: str | None, recipe: Path | None) -> tuple[int, ...]:
    """``--horizon 10,20,30`` or a recipe's ``curriculum.horizon`` (not both)."""
    if text and recipe:
        raise UserError("give --horizon or --recipe, not both")
    if recipe is not None:
        from curation.recipe import RecipeError, load_recipe

        try:
            return tuple(load_recipe(recipe).curriculum.horizon)
        except RecipeError as exc:
            raise UserError(str(exc)) from None
    try:
        steps = tuple(int(v) for v in (text or "").split(",") if v.strip())
    except ValueError:
        msg = f"--horizon {text!r}: step budgets separated by commas, e.g. 10,20,30"
        raise UserError(msg) from None
    if any(s < 1 for s in steps):
        raise UserError(f"--horizon {text!r}: every step budget must be at least 1")
    return steps


def _user_errors(fn: Any) -> Any:
    """Data that does not fit the model, a missing dataset or checkpoint: a usage error."""
    from training.interface import DataMismatch

    try:
        return fn()
    except (DataMismatch, LookupError) as exc:
        raise UserError(str(exc)) from None


def _live(label: str) -> Any:
    """The live progress bar (counts and rates) of a long command."""
    from cli.progress import LiveProgress

    return LiveProgress(label, console=console)


def _print_eval(res: dict[str, Any]) -> None:
    s = res["summary"]
    console.print(
        f"evaluation {res['evaluation_id']} ({res['policy']} on {res['suite']}/{res['split']}): "
        f"success {s['n_success']}/{s['n']} = {s['rate']:.1%} "
        f"[95% CI {s['ci_low']:.1%}, {s['ci_high']:.1%}]"
        + (f"; left out {s['excluded']}" if s["excluded"] else ""),
        soft_wrap=True,
    )
    for by in ("by_site", "by_difficulty"):
        for r in s[by]:
            key = r.get("site", r.get("difficulty"))
            console.print(
                f"  {by[3:]} {key}: {r['n_success']}/{r['n']} = {r['rate']:.1%} "
                f"[{r['ci_low']:.1%}, {r['ci_high']:.1%}]"
            )


def register(app: typer.Typer) -> None:
    """Add the training and evaluation commands to the ``webloop`` app."""
    train_app = typer.Typer(help="Train policies: SFT on a curated dataset, on-policy RL.")
    app.add_typer(train_app, name="train")
    eval_app = typer.Typer(help="Evaluate a policy or checkpoint on a split; compare two.")
    app.add_typer(eval_app, name="eval")
    ckpt_app = typer.Typer(help="Checkpoints and their lineage (which data trained them).")
    app.add_typer(ckpt_app, name="checkpoints")

    @train_app.command("sft")
    def train_sft(
        dataset: Annotated[str, typer.Option(help="Dataset name or id (webloop datasets list).")],
        model: Annotated[
            str, typer.Option(help="ranker (new), tiny (offline tiny VLM) or a model folder.")
        ] = "ranker",
        epochs: Annotated[int, typer.Option(min=1)] = 3,
        lr: Annotated[float, typer.Option(help="Learning rate.", min=1e-12, max=10.0)] = 1e-3,
        batch_size: Annotated[int, typer.Option(min=1)] = 32,
        max_steps: Annotated[
            int | None, typer.Option(help="Stop after this many steps.", min=1)
        ] = None,
        save_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] = 200,
        seed: Annotated[int, typer.Option(min=0, max=2**32 - 1)] = 0,
        reasoning_weight: Annotated[
            float, typer.Option(help="VLM: weight of thought tokens (RL4VLM λ).", min=0.0, max=1.0)
        ] = 1.0,
        lora_r: Annotated[
            int | None, typer.Option(help="VLM: LoRA rank (peft).", min=1, max=4096)
        ] = None,
        text_only: Annotated[
            bool, typer.Option(help="VLM: train on prompts without screenshots on purpose.")
        ] = False,
    ) -> None:
        """Supervised fine-tuning on a curated dataset (the train_sft flow); resumable."""
        from flows.train import SFTConfig
        from flows.train import train_sft as run

        cfg = SFTConfig(
            dataset=dataset,
            model=model,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            max_steps=max_steps,
            save_every=save_every,
            seed=seed,
            reasoning_weight=reasoning_weight,
            lora_r=lora_r,
            text_only=text_only,
        )
        with _live("train sft") as bar:
            res = _user_errors(lambda: run(cfg, on_progress=bar))
        resumed = f" (resumed from step {res['resumed_from']})" if res["resumed_from"] else ""
        console.print(
            f"training run {res['training_run_id']}: {res['steps_run']} steps{resumed}; "
            f"checkpoint {res['checkpoint_id']}\n  {res['checkpoint']}",
            soft_wrap=True,
        )

    @train_app.command("rl")
    def train_rl(
        policy: Annotated[str, typer.Option(help="Start checkpoint (id, training run or folder).")],
        estimator: Annotated[str, typer.Option(callback=_estimator)] = "grpo",
        iterations: Annotated[int, typer.Option(min=1)] = 2,
        group_size: Annotated[int, typer.Option(min=1, help="Samples per task (G).")] = 4,
        n_tasks: Annotated[int, typer.Option(min=1)] = 32,
        temperature: Annotated[
            float, typer.Option(help="Sampling temperature.", min=0.0, max=5.0)
        ] = 1.0,
        max_steps: Annotated[int, typer.Option(min=1)] = 30,
        horizon: Annotated[
            str | None,
            typer.Option(help="Per-iteration step budgets, e.g. 10,20,30 (TTI); last repeats."),
        ] = None,
        recipe: Annotated[
            Path | None, typer.Option(help="Take the horizon schedule from a curation recipe.")
        ] = None,
        lr: Annotated[float, typer.Option(help="Learning rate.", min=1e-12, max=10.0)] = 1e-3,
        ppo_epochs: Annotated[int, typer.Option(min=1)] = 2,
        clip_eps: Annotated[float, typer.Option(help="PPO clip range.", min=0.001, max=1.0)] = 0.2,
        kl_coef: Annotated[
            float, typer.Option(help="KL penalty weight.", min=0.0, max=100.0)
        ] = 0.0,
        seed: Annotated[int, typer.Option(min=0, max=2**32 - 1)] = 0,
        concurrency: Annotated[int, typer.Option(min=1)] = 8,
        prm_scorer: Annotated[
            str, typer.Option(help="step_*: scorer of the visited states (exact or vlm).")
        ] = "exact",
        prm_k: Annotated[int, typer.Option(min=2, help="step_*: candidates per state.")] = 4,
        prm_candidates: Annotated[
            str,
            typer.Option(help="step_*: top_k (the policy's K likeliest actions) or sample."),
        ] = "top_k",
        prm_max_states: Annotated[
            int | None, typer.Option(min=1, help="step_*: score at most this many states.")
        ] = None,
        prm_scorer_base_url: Annotated[str | None, typer.Option(help="vlm scorer URL.")] = None,
        prm_scorer_model: Annotated[str | None, typer.Option(help="vlm scorer model.")] = None,
        anchor_dataset: Annotated[
            str | None,
            typer.Option(help="A curated dataset whose SFT rows anchor each update (PPO-ptx)."),
        ] = None,
        anchor_coef: Annotated[
            float, typer.Option(min=0.0, help="Weight of the anchor's SFT loss (0: none).")
        ] = 0.0,
        task_pool: Annotated[
            int,
            typer.Option(
                min=0,
                help="Failures-first curriculum: run the policy greedily on this many tasks "
                "first, sample on the --n-tasks it failed (then solved) ones (0: off).",
            ),
        ] = 0,
    ) -> None:
        """On-policy RL: collect G samples per task, advantages, update, repeat (train_rl).
        ``step_grpo`` and ``step_awr`` also take K candidates at each visited state and score
        them (the score-steps stage) before each update; ``awr`` and ``step_awr`` update by
        weighted regression, the others by PPO-clip."""
        from flows.train import RLConfig
        from flows.train import train_rl as run

        cfg = RLConfig(
            horizon=_horizon(horizon, recipe),
            policy=policy,
            estimator=estimator,
            iterations=iterations,
            group_size=group_size,
            n_tasks=n_tasks,
            temperature=temperature,
            max_steps=max_steps,
            lr=lr,
            ppo_epochs=ppo_epochs,
            clip_eps=clip_eps,
            kl_coef=kl_coef,
            seed=seed,
            concurrency=concurrency,
            prm_scorer=prm_scorer,
            prm_k=prm_k,
            prm_candidates=prm_candidates,
            prm_max_states=prm_max_states,
            prm_scorer_base_url=prm_scorer_base_url,
            prm_scorer_model=prm_scorer_model,
            anchor_dataset=anchor_dataset,
            anchor_coef=anchor_coef,
            task_pool=task_pool,
        )
        _user_errors(cfg.check)  # before a flow starts
        with _live("train rl") as bar:
            res = _user_errors(lambda: run(cfg, on_progress=bar))
        for r in res["iterations"]:
            console.print(
                f"  iteration {r['iteration']}: mean reward {r['mean_reward']:.3f} over "
                f"{r['trajectories']} trajectories; checkpoint {r['checkpoint_id']}"
            )
        if res["training_run_id"] is None:
            console.print(
                "no update: no iteration's batch had a learning signal (every group's samples "
                f"got the same reward); the policy is the start checkpoint {res['checkpoint_id']}"
            )
        else:
            console.print(
                f"training run {res['training_run_id']}: checkpoint {res['checkpoint_id']}"
            )

    @eval_app.callback(invoke_without_command=True)
    def evaluate(
        ctx: typer.Context,
        policy: Annotated[str, typer.Option(help="ranker, hf, openai, expert or random.")] = (
            "ranker"
        ),
        checkpoint: Annotated[
            str | None, typer.Option(help="Checkpoint id, training run id or folder.")
        ] = None,
        split: Annotated[str, typer.Option(help="test, ood or train.")] = "test",
        n: Annotated[int, typer.Option(min=1, help="Tasks (episodes per sample).")] = 100,
        max_steps: Annotated[int, typer.Option(min=1)] = 30,
        temperature: float = 0.0,
        base_url: Annotated[str | None, typer.Option(help="openai: the endpoint.")] = None,
        model: Annotated[str | None, typer.Option(help="openai: the model name.")] = None,
        seed: Annotated[int, typer.Option(min=0, max=2**32 - 1)] = 0,
        concurrency: Annotated[int, typer.Option(min=1)] = 8,
        max_repeats: Annotated[
            int,
            typer.Option(
                min=0,
                help="End an episode at this many equal actions on one page (0 = never).",
            ),
        ] = 3,
    ) -> None:
        """Roll out a policy on a split, grade, and store success with 95% Wilson intervals."""
        if ctx.invoked_subcommand is not None:
            return
        from flows.evaluate import EvalConfig
        from flows.evaluate import evaluate as run

        cfg = EvalConfig(
            policy=policy,
            checkpoint=checkpoint,
            split=split,
            n=n,
            max_steps=max_steps,
            temperature=temperature,
            base_url=base_url,
            model=model,
            seed=seed,
            concurrency=concurrency,
            max_repeats=max_repeats,
        )
        with _live("eval") as bar:
            res = _user_errors(lambda: run(cfg, on_progress=bar))
        _print_eval(res)

    @eval_app.command("compare")
    def eval_compare(
        a: Annotated[str, typer.Argument(help="Evaluation (or checkpoint / run) id A.")],
        b: Annotated[str, typer.Argument(help="Evaluation (or checkpoint / run) id B.")],
    ) -> None:
        """B − A success rate with its 95% interval (Newcombe)."""
        from training.evaluate import compare, find_evaluation

        with _open(read_only=True) as wh:
            ea = _user_errors(lambda: find_evaluation(wh, a))
            eb = _user_errors(lambda: find_evaluation(wh, b))
        c = compare(ea, eb)
        warn = "" if c["same_split"] else "  (different suites/splits!)"
        console.print(
            f"A {c['a']}: {c['rate_a']:.1%}   B {c['b']}: {c['rate_b']:.1%}{warn}\n"
            f"B − A = {c['diff']:+.1%} [95% CI {c['ci_low']:+.1%}, {c['ci_high']:+.1%}]"
            + ("; the Wilson intervals do not overlap" if c["separated"] else ""),
            soft_wrap=True,
        )

    @ckpt_app.command("list")
    def ckpt_list(fmt: Annotated[Format, typer.Option("--format")] = Format.table) -> None:
        """Checkpoints with their training run, dataset and pinned snapshot."""
        from training.registry import lineage

        with _open(read_only=True) as wh:
            print_frame(lineage(wh), fmt)

    @ckpt_app.command("lineage")
    def ckpt_lineage(
        checkpoint: Annotated[str, typer.Argument(help="Checkpoint id.")],
        fmt: Annotated[Format, typer.Option("--format")] = Format.table,
    ) -> None:
        """Which data trained a checkpoint: run, dataset, snapshot, evaluations."""
        from training.registry import lineage

        with _open(read_only=True) as wh:
            df = lineage(wh, checkpoint)
            if df.is_empty():
                raise UserError(f"no checkpoint {checkpoint!r} (webloop checkpoints list)")
            print_frame(df, fmt)
            evals = wh.sql(
                "SELECT evaluation_id, suite, split, n, success_rate, ci_low, ci_high "
                "FROM evaluations WHERE checkpoint_id = ? ORDER BY created_at",
                [checkpoint],
            )
            if not evals.is_empty():
                print_frame(evals, fmt)
