"""Advantage estimators: pure functions over a polars frame of turns, registered by name.

Every estimator takes a frame with one row per turn (or per candidate action, for ``step_grpo``)
and returns the same frame, same row order, with a new float column ``advantage`` (``awr`` and
``step_awr`` add ``weight`` too). Look one up by name::

    est = ESTIMATORS.make("grpo", eps=1e-6)      # a configured ``frame -> frame`` callable
    frame = est(frame)
    frame = compute_advantages("awr", frame, gamma=0.9, beta=1.0)   # the same in one call

Each is registered with its :class:`EstimatorSpec` (``@register(name, level=..., objective=...,
inputs=..., engine=...)``): what the RL loop needs to know of it — trajectory or step level, PPO
or weighted regression, the inputs to add to its frame, the engine settings its rollouts need —
is declared here, beside the function, and the loop, the stage and the CLI ask the spec
(:func:`estimator_spec`). Adding an estimator is one decorated function in one module (its own,
imported through ``WEBLOOP_PLUGINS`` for the CLI): docs/how-to/add-an-estimator.md.

Infrastructure failures never become a learning signal: when the frame has a ``status`` column,
rows whose status is ``infra_error`` or ``timeout`` get ``advantage`` 0 (and ``weight`` 0 for
``awr``) AND are left out of every statistic (group means and stds, trajectory lengths, the
normalisation of ``turn``), exactly as if they were not in the frame.

Estimators (formulas in each docstring):

* ``grpo`` — trajectory-level group-relative (OpenWebRL / WebGym GRPO).
* ``step_grpo`` — step-level group-relative over PRM-scored candidates at a state (PRO-CUA).
* ``step_awr`` — those step-level advantages as AWR weights (weighted regression, no clipping).
* ``step_best`` — regression onto each state's best-scored candidate (AWR's β → 0 limit;
  DAgger's update with 0/1 reference labels).
* ``awr`` — advantage-weighted regression with a learned value baseline (DigiRL);
  :func:`fit_value_baseline` fits that baseline.
* ``turn`` — turn-level credit from rubric progress (ERA-style shaping).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import polars as pl

from training.interface import DataMismatch
from warehouse.advantage import EPS, group_relative, varies
from warehouse.records import INFRA_ERROR, TIMEOUT
from warehouse.registry import Registry, check_once, check_options, keyword_options

Estimator = Callable[[pl.DataFrame], pl.DataFrame]

ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
"""Estimator name → factory; ``ESTIMATORS.make(name, **options)`` returns ``frame -> frame``."""

EXCLUDED_STATUSES = (INFRA_ERROR, TIMEOUT)
"""Row statuses that never contribute: advantage 0, left out of all statistics."""

_ROW = "__row"
_KEEP = "__keep"


Inputs = Callable[[Any, pl.DataFrame, dict[str, Any]], pl.DataFrame]
"""``(warehouse, frame, options) -> frame``: columns an estimator needs added before it runs."""


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator as the RL loop sees it, declared where it is registered.

    ``level``: ``trajectory`` (the rollouts' own turns, rewarded by their outcome or a judge's
    verdict) or ``step`` (PRM-scored candidate actions at the visited states: the loop scores
    them before the update; rows carry ``score``). ``objective``: the update, ``ppo`` (PPO-clip
    on ``advantage``) or ``awr`` (weighted regression on the ``weight`` column the estimator
    adds). ``inputs``: columns to add to the frame first (``awr``'s value baseline, ``turn``'s
    rubric progress). ``engine``: engine settings the rollouts must turn on for it
    (``record_progress``). The options are the function's keyword parameters, with their
    defaults; the summary is its docstring's first line."""

    name: str
    fn: Callable[..., pl.DataFrame]
    level: Literal["trajectory", "step"] = "trajectory"
    objective: Literal["ppo", "awr"] = "ppo"
    inputs: Inputs | None = None
    engine: tuple[str, ...] = ()

    @property
    def options(self) -> dict[str, Any]:
        """Option name → default (the function's parameters after the frame)."""
        return keyword_options(self.fn, skip=1)

    @property
    def summary(self) -> str:
        """The function's docstring's first line."""
        return (inspect.getdoc(self.fn) or self.name).splitlines()[0]


SPECS: dict[str, EstimatorSpec] = {}
"""Estimator name → its spec (filled by :func:`register`)."""


def estimator_spec(name: str) -> EstimatorSpec:
    """The spec of a registered estimator; ValueError naming the known ones otherwise."""
    if name not in SPECS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(SPECS)}")
    return SPECS[name]


def names_at(level: str) -> list[str]:
    """The registered estimators of ``level`` (``trajectory`` or ``step``)."""
    return sorted(n for n, s in SPECS.items() if s.level == level)


def register(
    name: str,
    *,
    level: Literal["trajectory", "step"] = "trajectory",
    objective: Literal["ppo", "awr"] = "ppo",
    inputs: Inputs | None = None,
    engine: tuple[str, ...] = (),
) -> Callable:
    """``@register("grpo")`` on ``fn(frame, **options) -> frame``: registers a factory that
    checks the option names and returns ``fn`` with those options bound, and the estimator's
    :class:`EstimatorSpec` (the keyword arguments). A name registered twice is refused (an
    import under two names would otherwise replace a built-in silently)."""
    if objective not in ("ppo", "awr") or level not in ("trajectory", "step"):
        raise ValueError(f"estimator {name!r}: level trajectory|step, objective ppo|awr")

    def deco(fn: Callable[..., pl.DataFrame]) -> Callable[..., pl.DataFrame]:
        old = SPECS.get(name)
        check_once("advantage estimator", name, old.fn if old else None, fn)
        SPECS[name] = EstimatorSpec(name, fn, level, objective, inputs, tuple(engine))
        accepted = keyword_options(fn, skip=1)

        def factory(**options) -> Estimator:
            check_options("advantage estimator", name, options, accepted)
            return functools.partial(fn, **options)

        ESTIMATORS.register(name)(factory)
        return fn

    return deco


def compute_advantages(name: str, frame: pl.DataFrame, **options) -> pl.DataFrame:
    """Run the registered estimator ``name`` with ``options`` over ``frame``."""
    return ESTIMATORS.make(name, **options)(frame)


# -- shared helpers --------------------------------------------------------------------------------


def _prepare(frame: pl.DataFrame, name: str, required: list[str]) -> pl.DataFrame:
    """Check the columns, add a row index and the keep mask, and reject nulls in kept rows."""
    if not isinstance(frame, pl.DataFrame):
        kind = type(frame).__name__
        raise TypeError(f"advantage estimator {name!r}: expected a polars DataFrame, got {kind}")
    clash = [c for c in (_ROW, _KEEP) if c in frame.columns]
    if clash:
        raise ValueError(f"advantage estimator {name!r}: reserved column name(s) {clash} in frame")
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ValueError(
            f"advantage estimator {name!r}: missing column(s) {missing}; "
            f"it needs {required}, the frame has {frame.columns}"
        )
    keep = (
        ~pl.col("status").is_in(list(EXCLUDED_STATUSES)).fill_null(False)
        if "status" in frame.columns
        else pl.lit(True)
    )
    out = frame.with_row_index(_ROW).with_columns(keep.alias(_KEEP))
    kept = out.filter(pl.col(_KEEP))
    for col in required:
        bad = kept.filter(pl.col(col).is_null())
        if col in ("reward", "score", "value", "progress") and kept[col].dtype.is_float():
            bad = kept.filter(pl.col(col).is_null() | pl.col(col).is_nan())
        if bad.height:
            where = bad.row(0, named=True)
            raise ValueError(
                f"advantage estimator {name!r}: column {col!r} is null/NaN in {bad.height} row(s), "
                f"first at row {where[_ROW]} (traj_id={where.get('traj_id')!r})"
            )
    return out


def _constant_per_traj(kept: pl.DataFrame, name: str, cols: list[str]) -> None:
    """Raise when a per-trajectory column varies within one trajectory."""
    for col in cols:
        counts = kept.group_by("traj_id").agg(pl.col(col).n_unique().alias("k"))
        varying = counts.filter(pl.col("k") > 1)
        if varying.height:
            raise ValueError(
                f"advantage estimator {name!r}: {col!r} must be one value per trajectory; "
                f"trajectory {varying['traj_id'][0]!r} has {varying['k'][0]} different values"
            )


def _unique_steps(kept: pl.DataFrame, name: str) -> None:
    dup = kept.group_by("traj_id", "step_idx").len().filter(pl.col("len") > 1)
    if dup.height:
        raise ValueError(
            f"advantage estimator {name!r}: (traj_id, step_idx) must be unique; "
            f"({dup['traj_id'][0]!r}, {dup['step_idx'][0]}) occurs {dup['len'][0]} times"
        )


def _finish(out: pl.DataFrame, values: pl.DataFrame, cols: list[str], fill: dict) -> pl.DataFrame:
    """Join computed ``values`` (keyed by the row index) back in order; excluded rows get
    ``fill``."""
    merged = out.join(values.select(_ROW, *cols), on=_ROW, how="left", maintain_order="left")
    merged = merged.with_columns(pl.col(c).fill_null(fill[c]).cast(pl.Float64) for c in cols)
    return merged.sort(_ROW).drop(_ROW, _KEEP)


def _drop_produced(frame: pl.DataFrame, produced: list[str]) -> pl.DataFrame:
    """An existing ``advantage`` / ``weight`` column is replaced, not duplicated."""
    return frame.drop([c for c in produced if c in frame.columns])


# -- inputs some estimators need --------------------------------------------------------------


def value_features(frame: pl.DataFrame) -> np.ndarray:
    """State features of the learned baseline: one-hot site, the turn's position ``t`` and
    ``t / T`` in its trajectory, and ``T`` (longer tasks succeed less often)."""
    sites = sorted({s or "" for s in frame["site"].to_list()})
    onehot = np.array([[float((s or "") == k) for k in sites] for s in frame["site"].to_list()])
    t = frame["step_idx"].to_numpy().astype(np.float64)
    n = frame["n_turns"].to_numpy().astype(np.float64)
    return np.column_stack([onehot, t, t / np.maximum(n, 1.0), n])


def with_value(frame: pl.DataFrame, gamma: float) -> pl.DataFrame:
    """Add ``value``: the ridge baseline fitted to the discounted returns of these turns."""
    t = frame["step_idx"].to_numpy().astype(np.float64)
    n = frame["n_turns"].to_numpy().astype(np.float64)
    returns = gamma ** (n - 1 - t) * frame["reward"].to_numpy().astype(np.float64)
    x = value_features(frame)
    baseline = fit_value_baseline(x, returns)
    return frame.with_columns(value=pl.Series(baseline.predict(x)))


def with_progress(wh: Any, frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``progress`` from the trajectories' recorded per-step criteria progress."""
    meta = wh.sql(
        "SELECT traj_id, meta FROM trajectories WHERE traj_id IN (SELECT unnest(?))",
        [frame["traj_id"].unique().to_list()],
    )
    import json

    progress: dict[tuple[str, int], float] = {}
    for traj_id, m in meta.iter_rows():
        values = (json.loads(m) if isinstance(m, str) else (m or {})).get("progress")
        for i, v in enumerate(values or []):
            progress[(traj_id, i)] = float(v)
    missing = [
        (r["traj_id"], r["step_idx"])
        for r in frame.select("traj_id", "step_idx").iter_rows(named=True)
        if (r["traj_id"], r["step_idx"]) not in progress
    ]
    if missing:
        raise DataMismatch(
            f"estimator 'turn' needs per-step rubric progress; {len(missing)} turns have none "
            f"(e.g. {missing[0][0]} step {missing[0][1]}): collect with the engine's "
            "record_progress on (webloop train rl --estimator turn does, on bundled sites)"
        )
    return frame.with_columns(
        progress=pl.Series(
            [progress[(a, b)] for a, b in frame.select("traj_id", "step_idx").iter_rows()]
        )
    )


def value_inputs(wh: Any, frame: pl.DataFrame, options: dict[str, Any]) -> pl.DataFrame:
    """``awr``'s inputs: the learned value baseline at the option ``gamma``."""
    return with_value(frame, options.get("gamma", 1.0))


def progress_inputs(wh: Any, frame: pl.DataFrame, options: dict[str, Any]) -> pl.DataFrame:
    """``turn``'s inputs: the rubric progress the rollouts recorded."""
    return with_progress(wh, frame)


# -- estimators ------------------------------------------------------------------------------------


@register("grpo")
def grpo(frame: pl.DataFrame, eps: float = EPS) -> pl.DataFrame:
    """Trajectory-level group-relative advantage (GRPO, as in OpenWebRL / WebGym).

    Columns: ``traj_id``, ``group_id`` (trajectories sampled for the same task form a group),
    ``reward`` (the trajectory's reward, repeated on each of its turns).

    ``A(τ) = (R(τ) − mean_{τ'∈g} R(τ')) / (std_{τ'∈g} R(τ') + eps)`` with the population std over
    the group's *trajectories* (each counts once, whatever its length); a group of one or a
    group with one reward gives 0 (:func:`warehouse.advantage.group_relative`). Every turn of
    ``τ`` gets ``A(τ)``.

    :param eps: added to the group's std (no division by zero).
    """
    frame = _drop_produced(frame, ["advantage"])
    out = _prepare(frame, "grpo", ["traj_id", "group_id", "reward"])
    kept = out.filter(pl.col(_KEEP))
    _constant_per_traj(kept, "grpo", ["reward", "group_id"])
    per_traj = kept.group_by("traj_id").agg(pl.col("group_id").first(), pl.col("reward").first())
    per_traj = per_traj.with_columns(
        group_relative(pl.col("reward").cast(pl.Float64), ["group_id"], eps).alias("advantage")
    )
    per_traj = per_traj.select("traj_id", "advantage")
    values = kept.select(_ROW, "traj_id").join(per_traj, on="traj_id")
    return _finish(out, values, ["advantage"], {"advantage": 0.0})


@register("step_grpo", level="step")
def step_grpo(frame: pl.DataFrame, eps: float = EPS) -> pl.DataFrame:
    """Step-level group-relative advantage from process rewards (PRO-CUA).

    Columns: ``traj_id``, ``step_idx``, ``score`` (the PRM score of one candidate action at the
    state). A row is a candidate; the state group is ``(traj_id, step_idx)``:

    ``A(s, a) = (score(s, a) − mean_{a'} score(s, a')) / (std_{a'} score(s, a') + eps)``,
    population std over the state's candidates; a state with one candidate, or whose candidates
    all score the same, gives 0 (:func:`warehouse.advantage.group_relative`, the advantage
    ``judging.prm`` stores in ``step_scores``).

    :param eps: added to the group's std (no division by zero).
    """
    frame = _drop_produced(frame, ["advantage"])
    out = _prepare(frame, "step_grpo", ["traj_id", "step_idx", "score"])
    kept = out.filter(pl.col(_KEEP))
    values = kept.with_columns(
        group_relative(pl.col("score").cast(pl.Float64), ["traj_id", "step_idx"], eps).alias(
            "advantage"
        )
    )
    return _finish(out, values, ["advantage"], {"advantage": 0.0})


@register("step_awr", level="step", objective="awr")
def step_awr(
    frame: pl.DataFrame, beta: float = 0.5, w_max: float = 20.0, eps: float = EPS
) -> pl.DataFrame:
    """Step-level advantage-weighted regression from process rewards (AWR on PRO-CUA's signal).

    Columns: ``traj_id``, ``step_idx``, ``score`` (the PRM score of one candidate at the state).
    ``A(s, a)`` is :func:`step_grpo`'s advantage (the score normalised within the state), and

    ``weight(s, a) = min(exp(A(s, a) / β), w_max)`` where the state's candidates score
    differently, ``0`` where they all score the same.

    The update is weighted regression (``−Σ w·log π(a|s)``): mass moves to the candidates that
    scored best, however unlikely the policy found them, where PPO's clipped ratio lets a
    candidate of probability p grow only to (1 + ε)·p per update. A state without a signal weighs
    nothing: its candidates are the policy's own top choices (not samples), and weighting them
    alike would pull the policy toward choosing among them uniformly.

    :param beta: the temperature of the weights exp(A / beta).
    :param w_max: the largest weight.
    :param eps: added to the group's std (no division by zero).
    """
    if beta <= 0 or w_max <= 0:
        raise ValueError(f"step_awr: need beta > 0 and w_max > 0; got {beta=}, {w_max=}")
    frame = _drop_produced(frame, ["advantage", "weight"])
    out = _prepare(frame, "step_awr", ["traj_id", "step_idx", "score"])
    kept = out.filter(pl.col(_KEEP))
    state = ["traj_id", "step_idx"]
    score = pl.col("score").cast(pl.Float64)
    values = kept.with_columns(group_relative(score, state, eps).alias("advantage"))
    signal = varies(score, state)
    values = values.with_columns(
        pl.when(signal)
        .then((pl.col("advantage") / beta).exp().clip(upper_bound=w_max))
        .otherwise(0.0)
        .alias("weight")
    )
    return _finish(out, values, ["advantage", "weight"], {"advantage": 0.0, "weight": 0.0})


@register("step_best", level="step", objective="awr")
def step_best(frame: pl.DataFrame, eps: float = EPS) -> pl.DataFrame:
    """Step-level regression onto the best-scored candidate (AWR's β → 0 limit).

    Columns: ``traj_id``, ``step_idx``, ``score``. ``A(s, a)`` is :func:`step_grpo`'s advantage;

    ``weight(s, a) = 1`` for the candidates with the state's highest score where the state's
    candidates score differently, ``0`` otherwise.

    The update (weighted regression, ``−Σ w·log π(a|s)``) is cross-entropy toward the best
    action at each state, however unlikely the policy found it: one iteration can make a
    candidate the policy ranked fifth its first choice, which neither PPO-clip (a ratio capped
    at 1 + ε) nor :func:`step_awr` (positive weights on the worse candidates too) does. With
    the reference scorer's 0/1 labels it is DAgger's update on the labelled states.

    :param eps: added to the group's std (no division by zero).
    """
    frame = _drop_produced(frame, ["advantage", "weight"])
    out = _prepare(frame, "step_best", ["traj_id", "step_idx", "score"])
    kept = out.filter(pl.col(_KEEP))
    state = ["traj_id", "step_idx"]
    score = pl.col("score").cast(pl.Float64)
    values = kept.with_columns(group_relative(score, state, eps).alias("advantage"))
    best = varies(score, state) & (score == score.max().over(state))
    values = values.with_columns(pl.when(best).then(1.0).otherwise(0.0).alias("weight"))
    return _finish(out, values, ["advantage", "weight"], {"advantage": 0.0, "weight": 0.0})


@register("awr", objective="awr", inputs=value_inputs)
def awr(
    frame: pl.DataFrame, gamma: float = 1.0, beta: float = 1.0, w_max: float = 20.0
) -> pl.DataFrame:
    """Advantage-weighted regression with a learned value baseline (DigiRL).

    Columns: ``traj_id``, ``step_idx``, ``reward`` (the trajectory's final reward, repeated),
    ``value`` (the learned baseline's prediction ``V(s_t)``, e.g. from :func:`fit_value_baseline`).
    With ``T`` the number of (kept) turns of the trajectory and ``t`` the turn's position in it
    (0-based, ordered by ``step_idx``):

    ``G_t = γ^(T−1−t) · R``,  ``A_t = G_t − V(s_t)``,  ``weight_t = min(exp(A_t / β), w_max)``.

    Excluded rows (infra_error / timeout) get advantage 0 and weight 0.

    :param gamma: the discount over the turns left.
    :param beta: the temperature of the weights exp(A / beta).
    :param w_max: the largest weight.
    """
    if beta <= 0 or w_max <= 0 or not 0 < gamma <= 1:
        raise ValueError(
            f"awr: need 0 < gamma <= 1, beta > 0, w_max > 0; got {gamma=}, {beta=}, {w_max=}"
        )
    frame = _drop_produced(frame, ["advantage", "weight"])
    out = _prepare(frame, "awr", ["traj_id", "step_idx", "reward", "value"])
    kept = out.filter(pl.col(_KEEP))
    _constant_per_traj(kept, "awr", ["reward"])
    _unique_steps(kept, "awr")
    t = (pl.col("step_idx").rank("ordinal").over("traj_id") - 1).cast(pl.Float64)
    n = pl.len().over("traj_id").cast(pl.Float64)
    ret = pl.lit(float(gamma)) ** (n - 1 - t) * pl.col("reward").cast(pl.Float64)
    values = kept.with_columns((ret - pl.col("value").cast(pl.Float64)).alias("advantage"))
    values = values.with_columns(
        (pl.col("advantage") / beta).exp().clip(upper_bound=w_max).alias("weight")
    )
    return _finish(out, values, ["advantage", "weight"], {"advantage": 0.0, "weight": 0.0})


@register("turn", inputs=progress_inputs, engine=("record_progress",))
def turn(frame: pl.DataFrame, gamma: float = 1.0, eps: float = EPS) -> pl.DataFrame:
    """Turn-level credit from per-criterion rubric progress (ERA-style reward shaping).

    Columns: ``traj_id``, ``step_idx``, ``progress`` (share of the task's rubric criteria met
    after the turn, in [0, 1]), ``reward`` (the trajectory's final reward, repeated). Per
    trajectory, turns ordered by ``step_idx``, last turn ``T−1``:

    ``r_t = progress_t − progress_{t−1}`` (``progress_{−1} = 0``), plus ``R`` on the last turn;
    ``Â_t = Σ_{k≥t} γ^(k−t) r_k``; then over all kept rows ``A_t = (Â_t − mean Â) / (std Â + eps)``
    (population std; 0 everywhere when all ``Â`` are equal).

    :param gamma: the discount of later turns' progress.
    :param eps: added to the group's std (no division by zero).
    """
    frame = _drop_produced(frame, ["advantage"])
    out = _prepare(frame, "turn", ["traj_id", "step_idx", "progress", "reward"])
    kept = out.filter(pl.col(_KEEP))
    _constant_per_traj(kept, "turn", ["reward"])
    _unique_steps(kept, "turn")
    bad = kept.filter((pl.col("progress") < 0) | (pl.col("progress") > 1))
    if bad.height:
        raise ValueError(
            f"advantage estimator 'turn': progress must lie in [0, 1]; row {bad[_ROW][0]} "
            f"(traj_id={bad['traj_id'][0]!r}) has {bad['progress'][0]}"
        )
    kept = kept.sort("traj_id", "step_idx")
    returns = _discounted_returns(
        kept["traj_id"].to_numpy(),
        kept["progress"].cast(pl.Float64).to_numpy(),
        kept["reward"].cast(pl.Float64).to_numpy(),
        gamma,
    )
    values = kept.with_columns(pl.Series("ret", returns))
    values = values.with_columns(group_relative(pl.col("ret"), None, eps).alias("advantage"))
    return _finish(out, values, ["advantage"], {"advantage": 0.0})


def _discounted_returns(
    traj: np.ndarray, progress: np.ndarray, reward: np.ndarray, gamma: float
) -> np.ndarray:
    """Rows sorted by (traj, step): per-turn shaped rewards, discounted reward-to-go."""
    n = len(traj)
    out = np.zeros(n, dtype=np.float64)
    start = 0
    while start < n:
        end = start
        while end < n and traj[end] == traj[start]:
            end += 1
        prog = progress[start:end]
        r = np.diff(prog, prepend=0.0)
        r[-1] += reward[start]
        acc = 0.0
        for i in range(end - start - 1, -1, -1):
            acc = r[i] + gamma * acc
            out[start + i] = acc
        start = end
    return out


# -- the learned value baseline (DigiRL) -----------------------------------------------------------


@dataclass(frozen=True)
class ValueBaseline:
    """A linear value function ``V(x) = x·w + b`` fitted by :func:`fit_value_baseline`."""

    coef: np.ndarray
    intercept: float
    ridge: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``V`` for each row of ``features`` (``[N, d]``) → ``[N]``."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.coef.shape[0]:
            raise ValueError(
                f"ValueBaseline.predict: features must be [N, {self.coef.shape[0]}], got {x.shape}"
            )
        return x @ self.coef + self.intercept


def fit_value_baseline(
    features: np.ndarray, targets: np.ndarray, ridge: float = 1e-3
) -> ValueBaseline:
    """The learned baseline of ``awr`` (DigiRL's value function, here linear): closed-form ridge
    regression of ``targets`` (e.g. returns ``G_t`` or final rewards) on state ``features``
    (``[N, d]``, e.g. prompt embeddings), with an unpenalised intercept:

    ``w = (X̃ᵀX̃ + λI)⁻¹ X̃ᵀỹ`` on centred ``X̃ = X − x̄``, ``ỹ = y − ȳ``; ``b = ȳ − x̄·w``."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64).reshape(-1)
    if x.ndim != 2:
        raise ValueError(f"fit_value_baseline: features must be 2-D [N, d], got shape {x.shape}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"fit_value_baseline: {x.shape[0]} feature rows but {y.shape[0]} targets "
            "(need the same N ≥ 1)"
        )
    if ridge < 0 or not np.isfinite(x).all() or not np.isfinite(y).all():
        raise ValueError("fit_value_baseline: ridge must be ≥ 0 and features/targets finite")
    xm, ym = x.mean(axis=0), y.mean()
    xc, yc = x - xm, y - ym
    gram = xc.T @ xc + ridge * np.eye(x.shape[1])
    coef = np.linalg.lstsq(gram, xc.T @ yc, rcond=None)[0]
    return ValueBaseline(coef=coef, intercept=float(ym - xm @ coef), ridge=ridge)
