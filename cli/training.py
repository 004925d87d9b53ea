"""CLI commands of the training and evaluation stages: ``webloop train sft|rl``,
``webloop eval`` (+ ``eval compare``), ``webloop checkpoints list|lineage``."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import ConfigError, Format, FormatOption, _open, console, print_frame
from cli.options import config_command
from cli.protocols import register as register_protocols
from stages.evaluate import EvalConfig, EvalResult
from stages.train import RLConfig, SFTConfig
from training.advantages import SPECS


def _estimator(value: str) -> str:
    if value not in SPECS:  # (the registered ones: the built-in and WEBLOOP_PLUGINS' modules')
        raise typer.BadParameter(
            f"unknown estimator {value!r}; choose from {', '.join(sorted(SPECS))}"
        )
    return value


def _horizon(text: str | None, recipe: Path | None) -> tuple[int, ...]:
    """``--horizon 10,20,30`` or a recipe's ``curriculum.horizon`` (not both)."""
    if text and recipe:
        raise ConfigError("give --horizon or --recipe, not both")
    if recipe is not None:
        from curation.recipe import RecipeError, load_recipe

        try:
            return tuple(load_recipe(recipe).curriculum.horizon)
        except RecipeError as exc:
            raise ConfigError(str(exc)) from None
    try:
        steps = tuple(int(v) for v in (text or "").split(",") if v.strip())
    except ValueError:
        msg = f"--horizon {text!r}: step budgets separated by commas, e.g. 10,20,30"
        raise ConfigError(msg) from None
    if any(s < 1 for s in steps):
        raise ConfigError(f"--horizon {text!r}: every step budget must be at least 1")
    return steps


def _user_errors(fn: Any) -> Any:
    """Data that does not fit the model, a missing dataset or checkpoint: a usage error."""
    from training.interface import DataMismatch

    try:
        return fn()
    except (DataMismatch, LookupError) as exc:
        raise ConfigError(str(exc)) from None


def _live(label: str) -> Any:
    """The live progress bar (counts and rates) of a long command."""
    from cli.progress import LiveProgress

    return LiveProgress(label, console=console)


def _print_eval(res: EvalResult) -> None:
    ev, s = res.evaluation, res.summary
    console.print(
        f"evaluation {ev.evaluation_id} ({ev.policy} on {ev.suite}/{ev.split}"
        + (f", judge {ev.judge}" if ev.judge else "")
        + "): "
        f"success {s.n_success}/{s.n} = {s.rate:.1%} "
        f"[95% CI {s.ci_low:.1%}, {s.ci_high:.1%}]"
        + (f"; left out {s.excluded}" if s.excluded else ""),
        soft_wrap=True,
    )
    if s.clustered:
        c = s.clustered
        console.print(
            f"  resampling the {c['clusters']} task templates whole (tasks of a template succeed "
            f"or fail together): [95% CI {c['ci_low']:.1%}, {c['ci_high']:.1%}]",
            soft_wrap=True,
        )
    if s.within:
        w = s.within
        console.print(
            f"  resampling tasks within each of the {w['templates']} templates (the templates "
            f"fixed: new tasks of these templates): [95% CI {w['ci_low']:.1%}, "
            f"{w['ci_high']:.1%}]",
            soft_wrap=True,
        )
    if res.judged is not None:
        console.print(f"  judge run: {res.judged.line}", soft_wrap=True)
    ppi = (ev.breakdown or {}).get("ppi")
    if ppi:
        console.print(
            f"  judge-only {ppi['judge_rate']:.1%}; debiased by {ppi['n_labelled']} human "
            f"labels (prediction-powered): {ppi['rate']:.1%} [95% CI {ppi['ci_low']:.1%}, "
            f"{ppi['ci_high']:.1%}]; the judge agreed on {ppi['labelled_agreement']:.0%} of them "
            "(valid when the labelled trajectories are a random sample)",
            soft_wrap=True,
        )
    for by in ("by_site", "by_difficulty"):
        for r in getattr(s, by):
            key = r.get("site", r.get("difficulty"))
            console.print(
                f"  {by[3:]} {key}: {r['n_success']}/{r['n']} = {r['rate']:.1%} "
                f"[{r['ci_low']:.1%}, {r['ci_high']:.1%}]"
            )


def _print_compare(c: dict[str, Any], by: str) -> None:
    warn = "" if c["same_split"] else "  (different suites/splits!)"
    console.print(f"A {c['a']}: {c['rate_a']:.1%}   B {c['b']}: {c['rate_b']:.1%}{warn}")
    if c.get("protocol_differs"):
        fields = ", ".join(c["protocol_differs"])
        console.print(f"forced: the protocols differ ({fields})", soft_wrap=True)
    elif not c.get("protocol_known", True):
        console.print("protocol: not recorded for one of them (evaluated before protocols were)")
    if c["method"] != "paired":
        console.print(
            f"unpaired ({c['unpaired_because']}): B − A = {c['diff']:+.1%} "
            f"[95% CI {c['ci_low']:+.1%}, {c['ci_high']:+.1%}] (Newcombe, independent samples)"
            + ("; the Wilson intervals do not overlap" if c["separated"] else ""),
            soft_wrap=True,
        )
        return
    left = (
        f"; {c['unpaired_tasks']} task(s) scored in one only, left out"
        if c["unpaired_tasks"]
        else ""
    )
    if c.get("tasks_left_out"):
        left += f"; {c['tasks_left_out']} task(s) run by one only, left out (--common-tasks)"
    console.print(
        f"paired on {c['n_pairs']} tasks ({c['clusters']} template clusters){left}: "
        + _paired_line(c),
        soft_wrap=True,
    )
    for row in c.get(f"by_{by}", []) if by != "none" else []:
        console.print(f"  {by} {row[by]}: {row['n_pairs']} pairs, " + _paired_line(row))


def _paired_line(c: dict[str, Any]) -> str:
    p = c["mcnemar_p"]
    test = f"McNemar exact p = {p:.3g}" if p is not None else "McNemar: not binary"
    return (
        f"B − A = {c['diff']:+.1%} [95% cluster bootstrap {c['ci_low']:+.1%}, "
        f"{c['ci_high']:+.1%}]; {test} (only A solved {c['a_only']}, only B {c['b_only']})"
    )


def train_sft(cfg: SFTConfig) -> None:
    """Supervised fine-tuning on a curated dataset (the train_sft flow); resumable."""
    from flows.train import train_sft as run

    cfg.compute.check()  # (an unknown tracker) before a flow starts
    with _live("train sft") as bar:
        res = _user_errors(lambda: run(cfg, on_progress=bar))
    resumed = f" (resumed from step {res.resumed_from})" if res.resumed_from else ""
    console.print(
        f"training run {res.training_run_id}: {res.steps_run} steps{resumed}; "
        f"checkpoint {res.checkpoint_id}\n  {res.checkpoint}",
        soft_wrap=True,
    )


def train_rl(cfg: RLConfig, horizon: str | None = None, recipe: Path | None = None) -> None:
    """On-policy RL (the train_rl flow); see :class:`stages.train.RLConfig`."""
    from flows.train import train_rl as run

    if horizon or recipe:
        cfg = dataclasses.replace(cfg, horizon=_horizon(horizon, recipe))
    _user_errors(cfg.check)  # before a flow starts
    with _live("train rl") as bar:
        res = _user_errors(lambda: run(cfg, on_progress=bar))
    for r in res.iterations:
        console.print(
            f"  iteration {r.iteration}: mean reward {r.mean_reward:.3f} over "
            f"{r.trajectories} trajectories; checkpoint {r.checkpoint_id}"
        )
    if res.training_run_id is None:
        console.print(
            "no update: no iteration's batch had a learning signal (every group's samples "
            f"got the same reward); the policy is the start checkpoint {res.checkpoint_id}"
        )
    else:
        console.print(f"training run {res.training_run_id}: checkpoint {res.checkpoint_id}")


def evaluate(cfg: EvalConfig) -> None:
    """Roll out a policy on a split, grade, and store success with 95% Wilson intervals."""
    from flows.evaluate import evaluate as run

    with _live("eval") as bar:
        res = _user_errors(lambda: run(cfg, on_progress=bar))
    _print_eval(res)


def register(app: typer.Typer) -> None:
    """Add the training and evaluation commands to the ``webloop`` app."""
    train_app = typer.Typer(help="Train policies: SFT on a curated dataset, on-policy RL.")
    app.add_typer(train_app, name="train")
    eval_app = typer.Typer(help="Evaluate a policy or checkpoint on a split; compare two.")
    app.add_typer(eval_app, name="eval")
    ckpt_app = typer.Typer(help="Checkpoints and their lineage (which data trained them).")
    app.add_typer(ckpt_app, name="checkpoints")

    config_command(train_app, "sft", SFTConfig, train_sft, help=train_sft.__doc__)
    config_command(
        train_app,
        "rl",
        RLConfig,
        train_rl,
        help=(RLConfig.__doc__ or "").replace("\n    ", " "),
        callbacks={"estimator": _estimator},
        extra=[
            inspect.Parameter(
                "horizon",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    str | None,
                    typer.Option(
                        help="Per-iteration step budgets, e.g. 10,20,30 (TTI); last repeats."
                    ),
                ],
            ),
            inspect.Parameter(
                "recipe",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[
                    Path | None,
                    typer.Option(help="Take the horizon schedule from a curation recipe."),
                ],
            ),
        ],
    )

    config_command(eval_app, "eval", EvalConfig, evaluate, help=evaluate.__doc__, group=True)
    register_protocols(eval_app)

    @eval_app.command("compare")
    def eval_compare(
        a: Annotated[str, typer.Argument(help="Evaluation (or checkpoint / run) id A.")],
        b: Annotated[str, typer.Argument(help="Evaluation (or checkpoint / run) id B.")],
        by: Annotated[
            str, typer.Option(help="Paired comparisons: also per site or template.")
        ] = "site",
        force: Annotated[
            bool, typer.Option(help="Compare evaluations made under different protocols.")
        ] = False,
        common_tasks: Annotated[
            bool,
            typer.Option(help="Pair on the tasks both ran when their task sets differ."),
        ] = False,
    ) -> None:
        """B − A success rate with its 95% interval: paired (exact McNemar test, template-
        clustered bootstrap) when both ran the same tasks (or, with --common-tasks, on the tasks
        both ran), else Newcombe's unpaired interval."""
        from training.evaluate import ProtocolMismatch, compare_evaluations, find_evaluation

        if by not in ("site", "template", "none"):
            raise ConfigError(f"--by {by!r}: site, template or none")
        with _open(read_only=True) as wh:
            ea = _user_errors(lambda: find_evaluation(wh, a))
            eb = _user_errors(lambda: find_evaluation(wh, b))
            try:
                c = compare_evaluations(wh, ea, eb, force=force, common_tasks=common_tasks)
            except ProtocolMismatch as exc:
                raise ConfigError(str(exc)) from None
        _print_compare(c, by)

    @ckpt_app.command("list")
    def ckpt_list(fmt: FormatOption = Format.table) -> None:
        """Checkpoints with their training run, dataset and pinned snapshot."""
        from training.registry import lineage

        with _open(read_only=True) as wh:
            print_frame(lineage(wh), fmt)

    @ckpt_app.command("lineage")
    def ckpt_lineage(
        checkpoint: Annotated[str, typer.Argument(help="Checkpoint id.")],
        fmt: FormatOption = Format.table,
    ) -> None:
        """Which data trained a checkpoint: run, dataset, snapshot, evaluations."""
        from training.registry import lineage
        from warehouse.listings import checkpoint_evaluations

        with _open(read_only=True) as wh:
            df = lineage(wh, checkpoint)
            if df.is_empty():
                raise ConfigError(f"no checkpoint {checkpoint!r} (webloop checkpoints list)")
            print_frame(df, fmt)
            evals = checkpoint_evaluations(wh, checkpoint)
            if not evals.is_empty():
                print_frame(evals, fmt)
